"""The certified Markov walk: the full walk's ids, reading only the rows of W2 that can
still win a step (the reference that ``kernels/markov``'s certified kernel is tested
against, and the statistics of how much it reads).

A step's logit is ``z_v = round(U_v + round(W2[v] . e))`` with ``e = W1[prev]``, the dot
summed in fp32. Cauchy-Schwarz bounds the dot by ``||W2[v]|| ||e||``; fp32 summation
adds at most ``r 2^-24`` of ``sum |w_i e_i| <= ||W2[v]|| ||e||``, and rounding the bias at
most ``2^-8`` of it. So with ``B_v = ||W2[v]|| ||e|| (1 + 2^-7)``, every rounding being
monotone, ``z_v <= round(U_v + B_v) =: ub_v``, and a sampled row's score
``z_v / T + G_v`` is at most ``ub_v / T + G_v``.

A step first scores exactly a few candidates per request, chosen before the walk from
the base logits alone: the first column of the largest value (``U``, or ``U / T + G``
where the row samples) in each of ``candidates`` segments of the vocabulary. The best of
those exact scores, ``L``, is one the full walk sees, so the step's best is at least
``L``. Then it scores every column whose bound reaches ``L``. The best column and every
column tied with it are among those, so the first of the best is the full walk's pick,
ties included. The rows of W2 of the other columns are never read.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from dspark_compile.draft.sampling import rounded
from dspark_compile.kernels.markov.launch import candidate_segment
from dspark_compile.model.heads import row_norms
from dspark_compile.model.vocab import to_target
from dspark_compile.rng import gumbel

BLOCK, CANDIDATES = 128, 8  # the kernel's tile and candidates a request, at up to 16

# covers the bias's rounding to bf16 (2^-8), fp32 summation over any rank up to 1024
# (1024 * 2^-24) and the rounding of the norms and of their product
BOUND_SLACK = 2.0 ** -7


def upper_bounds(base: Tensor, norms: Tensor, e: Tensor) -> Tensor:
    """``ub [R, V]`` (fp32): no column's logit ``z`` of a step with base logits
    ``base [R, V]`` and Markov input ``e [R, r]`` exceeds its bound."""
    e_norm = row_norms(e)
    bias = norms[None, :] * (e_norm[:, None] * (1 + BOUND_SLACK))
    return rounded(base.float() + bias, base.dtype)


def scores(z: Tensor, noise: Tensor, temperature: Tensor) -> Tensor:
    """What a step maximises (float64): ``z`` where the row is greedy, ``z / T + G``
    where it samples with noise ``G`` (:func:`dspark_compile.draft.sampling.gumbel_scores`)."""
    hot = temperature > 0
    scaled = z.double() / torch.where(hot, temperature, 1.0).double()[:, None] + noise
    return torch.where(hot[:, None], scaled, z.double())


def candidates(base: Tensor, noise: Tensor, temperature: Tensor, block: int = BLOCK,
               count: int = CANDIDATES) -> Tensor:
    """``[R, <= count]`` columns whose exact scores bound each row's best from below: the
    first column of the largest :func:`scores` of the base logits alone in each segment of
    the vocabulary (``launch.candidate_segment`` tiles of ``block`` columns, as the
    kernel's pre-pass cuts it). One of them is the base logits' own best."""
    values = scores(base, noise, temperature)
    R, V = values.shape
    span = block * candidate_segment(-(-V // block), count)
    segments = F.pad(values, (0, -V % span), value=float("-inf")).view(R, -1, span)
    return segments.argmax(-1) + torch.arange(0, segments.shape[1] * span, span,
                                              device=base.device)


def contenders(w2: Tensor, norms: Tensor, e: Tensor, base: Tensor, noise: Tensor,
               temperature: Tensor, block: int = BLOCK, count: int = CANDIDATES
               ) -> tuple[Tensor, Tensor]:
    """``[R, V]``: the columns each row's step must score exactly, those whose bound reaches
    the best exact score of its :func:`candidates`; and those candidates ``[R, count]``."""
    bound = scores(upper_bounds(base, norms, e), noise, temperature)
    seeds = candidates(base, noise, temperature, block, count)
    least = torch.stack([_exact(w2, e[r:r + 1], base[r:r + 1], noise[r:r + 1],
                                temperature[r:r + 1], seeds[r])[0]
                         for r in range(len(seeds))])
    return bound >= least.amax(-1, keepdim=True), seeds


def certified_step(w2: Tensor, norms: Tensor, e: Tensor, base: Tensor, noise: Tensor,
                   temperature: Tensor) -> tuple[Tensor, int]:
    """Draft ids ``[R]`` of one step and the rows of W2 it read: each request's
    candidates, then the :func:`contenders` of every request, each once."""
    scored, seeds = contenders(w2, norms, e, base, noise, temperature)
    columns = scored.any(0).nonzero().squeeze(-1)  # ascending: ties keep the first
    exact = _exact(w2, e, base, noise, temperature, columns)
    exact = exact.masked_fill(~scored[:, columns], float("-inf"))
    return columns[exact.argmax(-1)], seeds.numel() + columns.numel()


def _exact(w2: Tensor, e: Tensor, base: Tensor, noise: Tensor, temperature: Tensor,
           columns: Tensor) -> Tensor:
    # every row's score at ``columns [m]``, W2 read at those rows only
    bias = F.linear(e, w2[columns]).float()  # in the model dtype, as the full walk's bias
    z = rounded(base[:, columns].float() + bias, base.dtype)
    return scores(z, noise[:, columns], temperature)


def certified_walk(w1: Tensor, w2: Tensor, norms: Tensor, base: Tensor, anchor: Tensor,
                   temperature: Tensor, seed: Tensor, anchor_pos: Tensor,
                   d2t: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """Target ids ``[R, k]`` of the k vanilla Markov steps from ``anchor`` over the base
    logits ``base [R, k, V]`` (the full walk's), and the rows of W2 each step read ``[k]``."""
    R, k, V = base.shape
    prev, ids, read = anchor, [], []
    for step in range(k):
        noise = gumbel(seed, anchor_pos, step, V)
        pick, rows = certified_step(w2, norms, w1[prev], base[:, step], noise, temperature)
        prev = to_target(pick, d2t)
        ids.append(prev)
        read.append(rows)
    return torch.stack(ids, 1), torch.tensor(read)
