"""Checkpoints made by the speculators package's own classes, and its own forward as the
reference a loaded drafter must match (float32, CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

VOCAB, HIDDEN, MASK = 512, 64, 511
LAYERS = dict(hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16)


def write_verifier(path: Path) -> Path:
    """A small Qwen3 target saved by transformers: the verifier whose embeddings and
    lm_head a speculators drafter borrows."""
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=VOCAB, **{**LAYERS, "num_hidden_layers": 6})
    Qwen3ForCausalLM(config).save_pretrained(path)
    return path


def write_checkpoint(path: Path, verifier: Path, *, layers: dict, draft_vocab: int = VOCAB,
                     aux: tuple[int, ...] = (1, 3, 5), seed: int = 0, **fields) -> Path:
    """A DSpark drafter made and saved by speculators (``save_pretrained``), with seeded
    weights; ``layers`` and ``fields`` go to its Qwen3 and DSpark configs."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.dspark import DSparkDraftModel, DSparkSpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    block = fields.pop("block_size", 6)
    config_class = fields.pop("config_class", Qwen3Config)
    layer_config = config_class(vocab_size=VOCAB, **{**LAYERS, **layers})
    fields.setdefault("markov_rank", 32)
    config = DSparkSpeculatorConfig(
        transformer_layer_config=layer_config, draft_vocab_size=draft_vocab, block_size=block,
        aux_hidden_state_layer_ids=list(aux), mask_token_id=MASK,
        speculators_config=SpeculatorsConfig(
            algorithm="dspark", default_proposal_method="greedy",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=block)],
            verifier=VerifierConfig(name_or_path=str(verifier),
                                    architectures=["Qwen3ForCausalLM"])), **fields)
    model = DSparkDraftModel(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith(("embed_tokens", "lm_head", "verifier_")):
                continue
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            elif p.dim() == 1 or name == "markov_head.markov_w1.weight":
                p.copy_(torch.randn(p.shape, generator=gen) * (0.1 if p.dim() == 1 else 1))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)
    if draft_vocab < VOCAB:
        chosen = torch.randperm(VOCAB, generator=gen)[:draft_vocab].sort().values
        t2d = torch.zeros(VOCAB, dtype=torch.bool)
        t2d[chosen] = True
        model.load_vocab_mappings(t2d, chosen - torch.arange(draft_vocab))
    model.load_verifier_weights()
    model.save_pretrained(path)
    return path


def load_reference(path: Path):
    """speculators' own load of a checkpoint, on its eager attention path."""
    from speculators.models.attention import create_float_mask
    from speculators.models.dspark import DSparkDraftModel

    model = DSparkDraftModel.from_pretrained(str(path)).float().eval()
    model.config.transformer_layer_config._attn_implementation = "eager"
    model._create_mask_fn = create_float_mask
    return model


@torch.no_grad()
def reference_draft(model, features: torch.Tensor, ids: torch.Tensor, anchor: int):
    """speculators' block forward at one anchor (context = positions before it), then the
    greedy walk through its own heads: ``block_bias`` over the block's slots up to the one
    drafting (the anchor's slot included, with the previous ids laid out as speculators'
    forward lays them out), and its confidence head. h, U, ids and confidences (None
    without the head) of the drafted rows."""
    length = features.shape[0]
    loss_mask = torch.zeros(1, length)
    loss_mask[0, anchor] = 1  # the only anchor select_anchors can pick
    hidden, logits, *_ = model._backbone_forward(
        features[None], ids[None], loss_mask, torch.zeros(1, length, HIDDEN),
        torch.zeros(1, length, dtype=torch.long), max_anchors=1)
    first = 0 if model.config.sample_from_anchor else 1  # the anchor row drafts or not
    h, base = hidden[0], logits[0]
    # slot j's previous id: the block's token j (anchor first); in 1+k, token j-1
    prevs, confidences = [int(ids[anchor])] * (1 + first), []
    for slot in range(first, h.shape[0]):
        step_logits = base[slot]
        if model.markov_head is not None:
            bias = model.markov_head.block_bias(prev_token_ids=torch.tensor([prevs]),
                                                hidden_states=h[None, :slot + 1])
            step_logits = step_logits + bias[0, -1]
        pick = int(torch.argmax(step_logits))
        if model.confidence_head is not None:
            features_in = h[slot]
            if model.config.confidence_head_with_markov:
                embedding = model.markov_head.prev_embeddings(torch.tensor([prevs[-1]]))[0]
                features_in = torch.cat([features_in, embedding])
            confidences.append(torch.sigmoid(model.confidence_head(features_in)))
        prevs.append(pick if model.d2t is None else pick + int(model.d2t[pick]))
    return (h[first:], base[first:], torch.tensor(prevs[1 + first:]),
            torch.stack(confidences) if confidences else None)


def edit_config(path: Path, change) -> None:
    config = json.loads((path / "config.json").read_text())
    change(config)
    (path / "config.json").write_text(json.dumps(config))
