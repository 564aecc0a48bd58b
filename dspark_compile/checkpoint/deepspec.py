"""DeepSpec's native format: a Qwen3 config.json with the drafter's fields beside it,
unprefixed tensor keys (``Qwen3DSparkModel`` of deepseek-ai/DeepSpec).

DeepSpec's Qwen3 drafter attends every layer in full (it writes ``layer_types`` all
``full_attention`` and drafts with no mask, so a sliding layer type is read as full),
drafts k = ``block_size`` tokens from the anchor row, has no reduced vocabulary, takes
taps -1 (the embedding output) to ``target_layer_ids``, and keeps its own ``lm_head``
whatever ``tie_word_embeddings`` says (the model ties nothing).
"""

from __future__ import annotations

from typing import Any

from dspark_compile.checkpoint.fields import (Reading, read_heads, read_transformer,
                                              transformer_config)
from dspark_compile.config import LaneConfig, Layout
from dspark_compile.errors import CheckpointError

ARCHITECTURE = "Qwen3DSparkModel"
NUM_ANCHORS = 512  # a training setting DeepSpec's from_pretrained requires; drafting ignores it


def read(config: dict[str, Any]) -> Reading:
    r = Reading(config, "DeepSpec")
    read_transformer(r)
    r.put("draft_vocab_size", r.fields["target_vocab_size"], "config.json vocab_size "
          "(DeepSpec drafts in the target's vocabulary)")
    types = config.get("layer_types") or []
    r.put("layer_types", [], "DeepSpec: every layer full_attention" + (
        f" (its draft attention ignores the {types.count('sliding_attention')} sliding "
        "layers of layer_types)" if "sliding_attention" in types else "")
        + " (use_sliding_window and sliding_window are not read)")
    r.put("sliding_window", None, "DeepSpec: no sliding window")
    r.take("k", "block_size")
    r.put("layout", Layout.anchor_first, "DeepSpec: k = block_size rows from the anchor")
    r.take("target_layer_ids", "target_layer_ids")
    r.take("mask_token_id", "mask_token_id")
    read_heads(r, {})
    return r


def write(lane: LaneConfig) -> dict[str, Any]:
    refusals = [(lane.has_d2t, f"a reduced draft vocabulary ({lane.draft_vocab_size}); only "
                 "the speculators format stores d2t"),
                (lane.has_sliding_layers, "sliding-window layers; DeepSpec attends every "
                 "layer in full"),
                (lane.layout is not Layout.anchor_first, "the one_plus_k layout; DeepSpec "
                 "drafts from the anchor row")]
    for refused, what in refusals:
        if refused:
            raise CheckpointError(f"lane {lane.name!r} has {what}")
    return {"architectures": [ARCHITECTURE], **transformer_config(lane),
            "block_size": lane.k, "mask_token_id": lane.mask_token_id,
            "target_layer_ids": lane.target_layer_ids, "num_anchors": NUM_ANCHORS,
            "markov_rank": lane.markov_rank, "markov_head_type": lane.markov_head.value,
            "enable_confidence_head": lane.confidence_head,
            "confidence_head_with_markov": lane.confidence_with_markov}
