"""DeepSpec's native format: a Qwen3 config.json with the drafter's fields beside it,
unprefixed tensor keys (``Qwen3DSparkModel`` of deepseek-ai/DeepSpec).

DeepSpec's Qwen3 drafter attends every layer in full (it writes ``layer_types`` all
``full_attention`` and drafts with no mask), drafts k = ``block_size`` tokens from the
anchor row, has no reduced vocabulary, and takes taps -1 (the embedding output) to
``target_layer_ids``.
"""

from __future__ import annotations

from typing import Any

from dspark_compile.checkpoint.fields import Reading, read_transformer, transformer_config
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
    if "sliding_attention" in types:
        raise r.refuse("layer_types", types, "DeepSpec's Qwen3 drafter attends every layer "
                       "in full; supported: full_attention")
    r.put("layer_types", [], "DeepSpec: every layer full_attention (use_sliding_window and "
          "sliding_window are not read)")
    r.put("sliding_window", None, "DeepSpec: no sliding window")
    if config.get("tie_word_embeddings"):
        raise r.refuse("tie_word_embeddings", True, "DeepSpec drafters keep their own "
                       "lm_head; supported: false")
    r.take("k", "block_size")
    r.put("layout", Layout.anchor_first, "DeepSpec: k = block_size rows from the anchor")
    r.take("target_layer_ids", "target_layer_ids")
    r.take("mask_token_id", "mask_token_id")
    rank = r.take("markov_rank", "markov_rank")
    if rank == 0:
        raise r.refuse("markov_rank", 0, "the draft step needs a Markov head; supported: >= 1")
    r.take("markov_head", "markov_head_type")
    if not r.value("enable_confidence_head")[0]:
        raise r.refuse("enable_confidence_head", False, "the draft step needs a confidence "
                       "head; supported: true")
    r.take("confidence_with_markov", "confidence_head_with_markov")
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
            "enable_confidence_head": True,
            "confidence_head_with_markov": lane.confidence_with_markov}
