"""Which cache slots a block row sees, against speculators' own DFlash mask
(``create_anchor_block_mask_mod``) materialised by FlexAttention's ``create_mask``."""

import pytest
import torch
from torch.nn.attention.flex_attention import create_mask

from dspark_compile.config import lane_config
from dspark_compile.model.masks import attention_masks

mask_mod_of = pytest.importorskip(
    "speculators.models.dflash.attention",
    reason="the speculators package is the format's reference "
           "(pip install --no-deps speculators==0.9.0)").create_anchor_block_mask_mod


@pytest.mark.parametrize("kind,window,causal", [
    ("full_attention", None, True), ("sliding_attention", 7, True),
    ("sliding_attention", 7, False), ("sliding_attention", 40, True)])
@pytest.mark.parametrize("anchor", [0, 3, 7, 8, 25])
def test_our_mask_is_speculators_mask(kind, window, causal, anchor):
    types = [kind, "full_attention"]
    lane = lane_config("tiny", layer_types=types, sliding_window=window if
                       "sliding_attention" in types else None, sliding_causal=causal)
    n, length, slots = lane.block_rows, anchor + 4, 64   # 4 base positions after the anchor
    mask_mod, q_len, kv_len = mask_mod_of(
        torch.zeros(length, dtype=torch.long), length, torch.tensor([anchor]), n,
        sliding_window=window if kind == "sliding_attention" else None,
        sliding_window_non_causal=not causal)
    theirs = create_mask(mask_mod, None, None, q_len, kv_len, "cpu")[0, 0]   # [n, L + n]
    ours = attention_masks(lane, torch.tensor([anchor]), slots)[kind][0, 0, :n]  # block rows
    assert torch.equal(ours[:, :anchor], theirs[:, :anchor])          # context
    assert not theirs[:, anchor:length].any()                         # the anchor and after
    assert torch.equal(ours[:, anchor:anchor + n], theirs[:, length:])  # the block
    assert not ours[:, anchor + n:].any()                             # scratch and trash
