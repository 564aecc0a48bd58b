"""The k-step Markov walk over a block's base logits, unrolled, and the draft distribution."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from dspark_compile.draft.sampling import rounded, sample
from dspark_compile.kernels import markov
from dspark_compile.model import Drafter
from dspark_compile.model.vocab import to_target


def markov_loop(drafter: Drafter, h: Tensor, base_logits: Tensor, state: Optional[Tensor],
                anchor: Tensor, temperature: Tensor, seed: Tensor, anchor_pos: Tensor,
                keep_logits: bool = True) -> tuple[Tensor, Tensor, Optional[Tensor]]:
    """The Markov walk, unrolled, from the head's ``state`` (:meth:`Drafter.block`): ids
    ``[R, k]``, ids fed to each step, and the corrected logits ``[R, k, V]`` when
    ``keep_logits``. A lane with ``fused_markov_step`` runs the walk in Triton on CUDA
    (:mod:`dspark_compile.kernels.markov`; ``certified_markov_walk``: its certified walk),
    which never writes the logits. Without a Markov head every step samples its base
    logits."""
    head = drafter.markov_head
    lane = drafter.lane
    if lane.fused_markov_step and base_logits.is_cuda and not keep_logits:
        w1, w2 = head.markov_w1.weight, head.markov_w2.weight
        if lane.certified_markov_walk:
            ids = markov.certified_markov_walk(w1, w2, head.w2_norms, base_logits, anchor,
                                               temperature, seed, anchor_pos, drafter.d2t)[0]
        else:
            ids = markov.markov_walk(w1, w2, base_logits, anchor, temperature, seed,
                                     anchor_pos, drafter.d2t)
        return ids, torch.cat([anchor[:, None], ids[:, :-1]], 1), None
    prev = anchor
    wide = torch.promote_types(base_logits.dtype, torch.float32)
    ids, prevs, logits = [], [], []
    for step in range(base_logits.shape[1]):
        prevs.append(prev)
        z = base_logits[:, step]
        if head is not None:
            bias, state = head.step_bias(prev, h[:, step], state)
            # A model-dtype '+', spelled out (widen, add, round once) so that no compiler
            # folds the add into the bias GEMM, which would skip the rounding of the bias.
            z = rounded(z.to(wide) + bias.to(wide), bias.dtype)
        prev = to_target(sample(z, temperature, seed, anchor_pos, step), drafter.d2t)
        ids.append(prev)
        logits.append(z.to(base_logits.dtype))
    kept = torch.stack(logits, 1) if keep_logits else None
    return torch.stack(ids, 1), torch.stack(prevs, 1), kept


def draft_probs(drafter: Drafter, logits: Tensor, ids: Tensor, temperature: Tensor) -> Tensor:
    """q ``[R, k, V_target]``: ``softmax(z / T)`` laid out in the target vocabulary, or the
    one-hot of the drafted token where T = 0 (greedy drafting is that distribution)."""
    lane = drafter.lane
    hot = (temperature > 0)[:, None, None]
    q = torch.softmax(logits.float() / torch.where(hot, temperature[:, None, None], 1.0), -1)
    R, k, V = q.shape
    target = torch.zeros(R, k, lane.target_vocab_size, device=q.device)
    draft_ids = torch.arange(V, device=q.device).expand(R, k, V)
    target = target.scatter(2, to_target(draft_ids, drafter.d2t), q)
    one_hot = torch.zeros_like(target).scatter(2, ids[..., None], 1.0)
    return torch.where(hot, target, one_hot)
