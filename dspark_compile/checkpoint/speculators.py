"""The speculators format (the ``speculators`` package's ``DSparkSpeculatorConfig``):
the drafter's fields at the top of config.json, its Qwen3 layers' config under
``transformer_layer_config``.

- Windows follow ``layer_types`` per layer: a ``sliding_attention`` layer sees the
  ``sliding_window`` context positions before the anchor and, unless
  ``sliding_window_non_causal``, the block causally; full-attention layers are
  bidirectional.
- ``sample_from_anchor: false`` drafts ``block_size - 1`` tokens from the mask rows (the
  one_plus_k layout); true drafts ``block_size`` from the anchor row.
- ``aux_hidden_state_layer_ids`` are indices into the target's ``hidden_states`` (0 is
  the embedding output): the lane's taps plus one.
- ``embed_tokens`` (and ``lm_head`` for a full-vocabulary draft) are the verifier's; a
  checkpoint written with a verifier leaves them out.
"""

from __future__ import annotations

from typing import Any, Optional

from dspark_compile.checkpoint.fields import (QWEN3_DEFAULTS, Reading, read_heads,
                                              read_transformer, transformer_config)
from dspark_compile.config import LaneConfig, Layout

MODEL_TYPE = "dspark"
VERSION = "0.9.0"  # the speculators release whose format this follows


def read(config: dict[str, Any]) -> Reading:
    r = Reading(config, "speculators")
    kind = config.get("speculators_model_type")
    if kind != MODEL_TYPE:
        raise r.refuse("speculators_model_type", kind, f"supported: {MODEL_TYPE!r} (a drafter "
                       "with a Markov head and a confidence head)")
    layers = r.at("transformer_layer_config")
    read_transformer(layers, ("qwen3", "llama"))
    # pydantic fields typed int: the format's own config refuses a null
    r.take("draft_vocab_size", "draft_vocab_size", 32000, nullable=False)
    read_attention(r, layers)
    anchor = r.take("layout", "sample_from_anchor", True,
                    lambda v: Layout.anchor_first if v else Layout.one_plus_k)
    block, source = r.value("block_size", 8, nullable=False)
    if not isinstance(anchor, bool) or not isinstance(block, int):
        raise r.refuse("sample_from_anchor, block_size", (anchor, block),
                       "expected true or false, and an integer")
    r.put("k", block if anchor else block - 1, source)
    r.take("target_layer_ids", "aux_hidden_state_layer_ids",
           convert=lambda ids: [i - 1 for i in ids] if isinstance(ids, list) else ids)
    r.take("mask_token_id", "mask_token_id")
    read_heads(r, {"markov_rank": 256, "markov_head_type": "vanilla",
                   "enable_confidence_head": True, "confidence_head_with_markov": True})
    return r


def read_attention(r: Reading, layers: Reading) -> None:
    """Per-layer types and the window, as Qwen3Config and speculators' DFlash derive them."""
    tl, count = layers.config, layers.fields["num_layers"]
    if tl.get("model_type", "qwen3") == "llama":  # LlamaConfig has no window fields of its own
        window, types = tl.get("sliding_window"), tl.get("layer_types") or []
    else:
        use_window = tl.get("use_sliding_window", QWEN3_DEFAULTS["use_sliding_window"])
        window = (tl.get("sliding_window", QWEN3_DEFAULTS["sliding_window"]) if use_window
                  else None)
        types = tl.get("layer_types")
    source = f"config.json {layers.prefix}layer_types"
    if types is None:
        first = tl.get("max_window_layers", QWEN3_DEFAULTS["max_window_layers"])
        types = ["sliding_attention" if window is not None and i >= first else "full_attention"
                 for i in range(count if isinstance(count, int) else 0)]
        source = "Qwen3Config's rule (use_sliding_window, max_window_layers)"
    if window is None or "sliding_attention" not in types:
        # a sliding layer with no window attends like a full one (speculators' mask)
        types, window = [], None
    layers.put("layer_types", types, source)
    layers.put("sliding_window", window, f"config.json {layers.prefix}use_sliding_window, "
               "sliding_window")
    r.take("sliding_causal", "sliding_window_non_causal", False, lambda v: not v)


def write(lane: LaneConfig, verifier: Optional[dict[str, Any]]) -> dict[str, Any]:
    """``verifier``: ``{"name_or_path", "architectures"}`` of the target, or None."""
    anchor_first = lane.layout is Layout.anchor_first
    return {
        "speculators_model_type": MODEL_TYPE,
        "speculators_version": VERSION,
        "architectures": ["DSparkSpeculator"],
        "transformer_layer_config": transformer_config(lane),
        "draft_vocab_size": lane.draft_vocab_size,
        "block_size": lane.k if anchor_first else lane.k + 1,
        "sample_from_anchor": anchor_first,
        "aux_hidden_state_layer_ids": [i + 1 for i in lane.target_layer_ids],
        "mask_token_id": lane.mask_token_id,
        "sliding_window_non_causal": not lane.sliding_causal,
        "markov_rank": lane.markov_rank,
        "markov_head_type": lane.markov_head.value,
        "enable_confidence_head": lane.confidence_head,
        "confidence_head_with_markov": lane.confidence_with_markov,
        "speculators_config": {
            "algorithm": MODEL_TYPE,
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": lane.k}],
            "default_proposal_method": "greedy",
            "verifier": verifier or {"name_or_path": None, "architectures": []},
        },
    }
