"""Verification of a drafted block against the target, on the device.

Both return ``(accepted [R], tokens [R, k+1])``: the first ``accepted + 1`` entries of a
row are the tokens that row emits this round (the accepted drafts, then the target's
correction or, when every draft was accepted, its bonus token). ``lengths [R]``, where
given, verifies only a row's first ``lengths`` drafts: the rest count as never drafted,
so the token after them is the target's own (a shorter draft, verified as losslessly).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from dspark_compile.kernels import runs_on
from dspark_compile.kernels.noise import uniform

# the verifier's noise stream, apart from the drafter's steps 0 .. k-1: per row, k uniforms
# for the drafts' acceptance and one for the correction
ACCEPT_STREAM = 1 << 20


def verify_greedy(draft_ids: Tensor, target_ids: Tensor, lengths: Optional[Tensor] = None
                  ) -> tuple[Tensor, Tensor]:
    """Longest prefix of ``draft_ids [R, k]`` the target's own greedy tokens
    ``target_ids [R, k+1]`` agree with, plus the target's token after it."""
    k = draft_ids.shape[1]
    accepted = torch.cumprod(draft_ids == target_ids[:, :k], dim=1).sum(dim=1)
    if lengths is not None:
        accepted = torch.minimum(accepted, lengths)
    return accepted, target_ids


def verify_sampling(draft_ids: Tensor, q: Tensor, p: Tensor, seed: Tensor, position: Tensor,
                    lengths: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """Standard speculative sampling (lossless: the emitted tokens follow ``p``).

    ``draft_ids [R, k]`` were drawn from ``q [R, k, V]``; ``p [R, k+1, V]`` is the target's
    distribution at each drafted position and one past it. Draft i is accepted with
    probability ``min(1, p_i(x_i) / q_i(x_i))``; at the first rejection j the token is drawn
    from ``max(0, p_j - q_j)`` normalised; if all k are accepted, a bonus token from
    ``p_k``. The randomness is the counter-based noise keyed by ``(seed, position)``.
    """
    R, k = draft_ids.shape
    rows = torch.arange(R, device=draft_ids.device)
    drafted = torch.full((R,), k, device=draft_ids.device) if lengths is None else lengths
    # drafts past a row's length: as if never drafted (q = 0); only the [R, k] and [R, V]
    # entries read are masked, never all of q
    p_draft = p[:, :k].gather(-1, draft_ids[..., None]).squeeze(-1)
    q_draft = q.gather(-1, draft_ids[..., None]).squeeze(-1) * (
        torch.arange(k, device=q.device)[None, :] < drafted[:, None])
    u = uniform(seed, position, ACCEPT_STREAM, k + 1)
    accept = u[:, :k] * q_draft.double() < p_draft.double()  # u < p/q, without dividing by 0
    accept &= q_draft > 0  # never a draft of no chance: one past a row's length
    accepted = torch.cumprod(accept.long(), dim=1).sum(dim=1)
    # the distribution of the token after the accepted prefix: residual, or p_k as bonus
    # (q there is 0 once every verified draft was accepted)
    q_next = (q[rows, accepted.clamp(max=k - 1)] * (accepted < drafted)[:, None] if k
              else q.new_zeros(R, q.shape[-1]))
    residual = (p[rows, accepted] - q_next).clamp_min(0).double()
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual,
                           p[rows, accepted].double())  # p == q: nothing left to correct
    # inverse transform: the first token whose cumulative mass passes u of the total (a
    # token of no mass never does); one uniform a row, not a noise vector of V
    cumulative = residual.cumsum(-1)
    correction = torch.searchsorted(cumulative, u[:, k:] * cumulative[:, -1:], right=True)
    tokens = torch.cat([draft_ids, draft_ids.new_zeros(R, 1)], dim=1)
    tokens[rows, accepted] = correction[:, 0]
    return accepted, tokens


def target_probs(logits: Tensor, rows: Tensor, temperature: float) -> Tensor:
    """The target's distribution ``softmax(logits[rows] / temperature)``."""
    scaled = logits[rows]  # a copy: scaled in place, and not at all at T = 1
    if temperature != 1.0:
        scaled /= temperature
    return torch.softmax(scaled, -1)


def verify_rows(drafted: Tensor, q: Tensor, logits: Tensor, rows: Tensor, temperature: float,
                seed: Tensor, position: Tensor, lengths: Optional[Tensor] = None
                ) -> tuple[Tensor, Tensor]:
    """:func:`verify_sampling` of the drafts ``drafted[rows]`` against the target's
    ``logits[rows]`` at ``temperature``: one kernel where the kernels run
    (:mod:`dspark_compile.kernels.verify`), else the tensor ops."""
    if runs_on(logits.device):
        from dspark_compile.kernels.verify import verify_sampling_fused

        return verify_sampling_fused(drafted, q, logits, rows, temperature, seed, position,
                                     ACCEPT_STREAM, lengths)
    return verify_sampling(drafted[rows], q, target_probs(logits, rows, temperature), seed,
                           position, lengths)
