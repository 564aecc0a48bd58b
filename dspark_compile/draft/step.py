"""The draft step on the device: one function of (weights, KV state, this round's inputs).

Context append, the block forward, the k-step Markov loop unrolled in Python, d2t and the
confidences: no ``.item()``, no host tensors, no data-dependent shapes, so a compiler can
capture the whole round as one graph and only ``[R, k]`` ids and confidences leave it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dspark_compile.draft.checks import check_round, context_capacity, round_rules
from dspark_compile.draft.inputs import DraftOutput, KVCache, RoundInputs
from dspark_compile.draft.markov import draft_probs, markov_loop
from dspark_compile.model import Drafter


class DraftStep(nn.Module):
    """The module every backend compiles. Mutates the cache in place (the context append).

    Returns ``(ids, confidences, rules)``, plus the draft distribution q when ``with_probs``.
    ``rules`` is :func:`~dspark_compile.draft.checks.round_rules` of the inputs: a round
    that breaks one runs inert (no new context, the anchor at the context capacity, nothing
    indexed out of range), so the caller can check it after the round, in the same host
    sync as the ids.
    """

    def __init__(self, drafter: Drafter, with_probs: bool = False):
        super().__init__()
        self.drafter = drafter
        self.with_probs = with_probs

    def forward(self, k_cache: Tensor, v_cache: Tensor, features: Tensor, num_new: Tensor,
                anchor: Tensor, anchor_pos: Tensor, temperature: Tensor, seed: Tensor
                ) -> tuple[Tensor, ...]:
        d = self.drafter
        rules, (num_new, anchor, anchor_pos, temperature, seed) = inert_unless_kept(
            d, k_cache, features, num_new, anchor, anchor_pos, temperature, seed)
        h, base_logits, state = d.block(k_cache, v_cache, anchor, anchor_pos, features,
                                        num_new)
        ids, prevs, logits = markov_loop(d, h, base_logits, state, anchor, temperature, seed,
                                         anchor_pos, keep_logits=self.with_probs)
        confidences = d.confidences(h, prevs)
        if self.with_probs:
            return ids, confidences, rules, draft_probs(d, logits, ids, temperature)
        return ids, confidences, rules


class PrefillStep(nn.Module):
    """A prompt's context append alone, for a runtime with no eager append of its own (the
    C++ one): any number of feature rows, the draft step's rules, and nothing appended in
    a round that breaks one. Returns the rules vector. The runtime then runs the draft
    step with no new rows, as the Python runner does after its eager append."""

    def __init__(self, drafter: Drafter):
        super().__init__()
        self.drafter = drafter

    def forward(self, k_cache: Tensor, v_cache: Tensor, features: Tensor, num_new: Tensor,
                anchor: Tensor, anchor_pos: Tensor, temperature: Tensor, seed: Tensor
                ) -> Tensor:
        rules, (num_new, _, anchor_pos, _, _) = inert_unless_kept(
            self.drafter, k_cache, features, num_new, anchor, anchor_pos, temperature, seed)
        self.drafter.append_context(k_cache, v_cache, features, num_new, anchor_pos)
        return rules


def inert_unless_kept(drafter: Drafter, k_cache: Tensor, features: Tensor, num_new: Tensor,
                      anchor: Tensor, anchor_pos: Tensor, temperature: Tensor, seed: Tensor
                      ) -> tuple[Tensor, tuple[Tensor, ...]]:
    """:func:`round_rules` of a round, and its inputs after num_new to features, or inert
    ones (no new context, the anchor at the context capacity) where a rule is broken."""
    slots = k_cache.shape[-2]
    rules = round_rules(drafter.lane, slots, features, num_new, anchor, anchor_pos,
                        temperature, seed)
    ok = rules.all()
    num_new, anchor, seed = (t.where(ok, 0) for t in (num_new, anchor, seed))
    anchor_pos = anchor_pos.where(ok, context_capacity(drafter.lane, slots))
    return rules, (num_new, anchor, anchor_pos, temperature.where(ok, 0.0), seed)


@torch.no_grad()
def draft(drafter: Drafter, cache: KVCache, inputs: RoundInputs,
          with_probs: bool = False) -> DraftOutput:
    """One eager draft round on the device, after checking the inputs."""
    check_round(drafter.lane, cache, inputs)
    ids, confidences, _, *probs = DraftStep(drafter, with_probs)(cache.k, cache.v,
                                                                *inputs.tensors())
    if not drafter.lane.confidence_head:
        confidences = None
    return DraftOutput(ids, confidences, *probs)
