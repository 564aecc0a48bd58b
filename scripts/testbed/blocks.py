"""Teacher-forced draft blocks over whole sequences, shared by training and evaluation: the
target's features of every position, then at anchor ``s`` the block a round anchored there
drafts, its context the positions before ``s`` and its Markov head fed the true previous
tokens. While every earlier position of a block was accepted, those are the tokens the
drafter itself picked, so a reached position's outputs are exactly a real round's."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dspark_compile import KVCache
from dspark_compile.model import Drafter


@torch.no_grad()
def target_pass(target, tokens: Tensor, taps: list[int]) -> tuple[Tensor, Tensor]:
    """The target's features ``[B, T, F]`` and logits ``[B, T, V]`` of padded sequences (a
    causal model: padding after a sequence changes none of its positions)."""
    out = target(tokens, output_hidden_states=True)
    features = torch.cat([out.hidden_states[t + 1] for t in taps], dim=-1)
    return features, out.logits


@dataclass
class Blocks:
    """``N`` blocks of ``k`` positions: the backbone's rows ``h [N, k, H]``, base logits
    ``U [N, k, V]``, final logits ``z = U + bias(previous token)`` (rounded as the runtime
    rounds them, held in fp32), the true next
    tokens ``labels [N, k]``, the target's logits there ``[N, k, V]``, the confidence
    head's logits ``[N, k]`` (before the sigmoid), and each block's sequence and anchor
    (``rows``, ``s``)."""
    h: Tensor
    base: Tensor
    z: Tensor
    labels: Tensor
    target_logits: Tensor
    confidence_logits: Tensor
    rows: Tensor
    s: Tensor


def context(drafter: Drafter, features: Tensor, valid: Tensor) -> KVCache:
    """The drafter's cache of every position of sequences whose target features are
    ``features [B, T, F]`` (``valid [B]`` real rows each): a block anchored at ``s`` sees
    the positions before ``s`` only."""
    lane = drafter.lane
    cache = KVCache.allocate(lane, features.shape[0], features.device,
                             max_context=features.shape[1])
    drafter.append_context(cache.k, cache.v, features.to(lane.torch_dtype), valid, valid)
    return cache


def teacher_forced(drafter: Drafter, cache: KVCache, tokens: Tensor, target_logits: Tensor,
                   rows: Tensor, s: Tensor) -> Blocks:
    """The blocks anchored at ``s [N]`` of sequences ``rows [N]`` of ``tokens [B, T]``
    over their :func:`context` ``cache`` (every ``s + k`` a real position),
    differentiable."""
    lane = drafter.lane
    steps = torch.arange(lane.k, device=tokens.device)
    # for the backward pass functionalized: each layer writes its block into the cache
    # another layer's attention saved; out of place, every version stays what it was
    forward = torch.func.functionalize(drafter) if torch.is_grad_enabled() else drafter
    h, base = forward(cache.k[rows], cache.v[rows], tokens[rows, s], s)
    prevs = tokens[rows[:, None], s[:, None] + steps]      # the anchor, then the true tokens
    head = drafter.markov_head
    bias = head.step_bias(prevs.reshape(-1), h.reshape(-1, h.shape[-1]), None)[0]
    # widened, added, rounded once to the model dtype: the runtime's z
    z = (base.float() + bias.view_as(base).float()).to(base.dtype).float()
    confidence_in = h
    if drafter.confidence_head.with_markov:
        confidence_in = torch.cat([h, head.markov_w1(prevs)], -1)
    return Blocks(h, base, z, tokens[rows[:, None], s[:, None] + 1 + steps],
                  target_logits[rows[:, None], s[:, None] + steps],
                  drafter.confidence_head.proj(confidence_in).squeeze(-1).float(), rows, s)
