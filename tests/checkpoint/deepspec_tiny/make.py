"""Make the DeepSpec fixture beside this file with DeepSpec's own code: a tiny
``Qwen3DSparkModel`` configured by ``build_draft_config``, saved by ``save_pretrained``,
and two greedy draft rounds through DeepSpec's inference path (``forward_dspark_draft_block``
with its KV cache, then ``build_dspark_proposal``) recorded in ``reference.safetensors``.

DeepSpec is not on PyPI; from the repository root, with a DeepSpec checkout (afdfa7c):

    PYTHONPATH=<DeepSpec checkout> python tests/checkpoint/deepspec_tiny/make.py
"""

from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import DynamicCache, Qwen3Config

from deepspec.eval.dspark.draft_ops import build_dspark_proposal, forward_dspark_draft_block
from deepspec.modeling.dspark.qwen3.config import build_draft_config
from deepspec.modeling.dspark.qwen3.modeling import Qwen3DSparkModel

HERE = Path(__file__).resolve().parent
BLOCK, MASK = 4, 255


class Args(dict):
    __getattr__ = dict.__getitem__


def make_model() -> Qwen3DSparkModel:
    # non-default values that change the arithmetic: a scaled RoPE, the eps, the embedding
    # tap -1; a window DeepSpec never applies
    target = Qwen3Config(vocab_size=256, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=8, rms_norm_eps=1e-5, use_sliding_window=True,
                         sliding_window=4, max_window_layers=0,
                         rope_parameters={"rope_type": "linear", "rope_theta": 5e5,
                                          "factor": 2.0})
    config = build_draft_config(target, Args(
        num_draft_layers=2, target_layer_ids=[-1, 3, 6], block_size=BLOCK,
        mask_token_id=MASK, num_anchors=16, markov_rank=16, markov_head_type="vanilla",
        confidence_head_alpha=1.0, confidence_head_with_markov=True))
    config._attn_implementation = "eager"
    model = Qwen3DSparkModel(config)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            elif p.dim() == 1 or name in ("embed_tokens.weight", "markov_head.markov_w1.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * (0.1 if p.dim() == 1 else 1))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)
    return model.eval()


@torch.no_grad()
def rounds(model: Qwen3DSparkModel) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    width = 3 * model.config.hidden_size
    cache, record, start = DynamicCache(), {}, 0
    for i, new in enumerate((12, 3)):  # a prompt of 12 rows, then 3 accepted + 1
        features = torch.randn(1, new, width, generator=gen)
        start += new
        anchor = int(torch.randint(0, MASK, (1,), generator=gen))
        ids = torch.tensor([[anchor] + [MASK] * (BLOCK - 1)])
        hidden = forward_dspark_draft_block(
            model, draft_input_ids=ids, position_ids=torch.arange(start + BLOCK)[None],
            past_key_values_draft=cache, target_hidden_states=features, start=start,
            block_size=BLOCK)
        proposal = build_dspark_proposal(model, draft_input_ids=ids, block_hidden=hidden,
                                         block_size=BLOCK, temperature=0.0,
                                         confidence_threshold=0.0)
        record.update({f"features{i}": features[0], f"anchor{i}": torch.tensor(anchor),
                       f"anchor_pos{i}": torch.tensor(start), f"hidden{i}": hidden[0],
                       f"ids{i}": proposal.verify_input_ids[0, 1:],
                       f"confidence_logits{i}": proposal.confidence_logits[0]})
    return record


if __name__ == "__main__":
    model = make_model()
    model.save_pretrained(HERE / "checkpoint")
    save_file(rounds(model), str(HERE / "reference.safetensors"))
    print(f"wrote {HERE / 'checkpoint'} and {HERE / 'reference.safetensors'}")
