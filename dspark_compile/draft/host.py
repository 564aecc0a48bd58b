"""The host path: what engines did before the fix, instrumented. It is the identity oracle.

The same backbone runs on the device; then the base logits come down as f32 and, per step,
``prev`` goes up, the Markov bias is computed on the device and comes down, and the host
adds, rounds to the model dtype and takes the first-index argmax, then applies d2t.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from dspark_compile.draft.checks import check_round
from dspark_compile.draft.inputs import KVCache, RoundInputs
from dspark_compile.draft.sampling import gumbel_scores
from dspark_compile.model import Drafter


@dataclass
class Transfers:
    """Traffic of one draft round between device and host."""

    d2h_bytes: int = 0
    h2d_bytes: int = 0
    syncs: int = 0


@dataclass
class HostResult:
    ids: Tensor          # [R, k] int64, on the host
    confidences: Optional[Tensor]  # [R, k] float32, on the host; None without the head
    transfers: Transfers
    # [R] greedy steps whose best two logits lie within one model-dtype epsilon (relative)
    # of each other, exact ties included: where a backend that rounds differently could flip
    # a token (sampled steps compare float64 scores with continuous noise: no such ties)
    near_ties: Tensor


class HostPath:
    def __init__(self, drafter: Drafter):
        self.drafter = drafter
        self.device = drafter.fc.weight.device
        # an engine keeps its d2t table on the host: loaded once, not per round
        self.d2t = None if drafter.d2t is None else drafter.d2t.cpu().numpy()

    def _down(self, t: Tensor, log: Transfers) -> Tensor:
        log.d2h_bytes += t.numel() * t.element_size()
        log.syncs += 1
        return t.cpu()

    def _up(self, t: Tensor, log: Transfers) -> Tensor:
        log.h2d_bytes += t.numel() * t.element_size()
        return t.to(self.device)

    @torch.no_grad()
    def draft(self, cache: KVCache, inputs: RoundInputs) -> HostResult:
        d, log = self.drafter, Transfers()
        check_round(d.lane, cache, inputs)
        features, num_new, anchor, anchor_pos, temperature, seed = inputs.tensors()
        h, base_logits, state = d.block(cache.k, cache.v, anchor, anchor_pos, features,
                                        num_new)
        # f32 is exact for bf16/f16 logits; wider dtypes come down as they are
        base = self._down(base_logits.to(torch.promote_types(base_logits.dtype, torch.float32)),
                          log)
        prev = self._down(anchor, log).numpy()
        # the sampling parameters: an engine holds these on the host already
        temperature, seed, anchor_pos = (t.cpu() for t in (temperature, seed, anchor_pos))
        hot = (temperature > 0).numpy()
        ids, prevs = [], []
        near_ties = np.zeros(base.shape[0], dtype=np.int64)
        eps = torch.finfo(base_logits.dtype).eps
        for step in range(base.shape[1]):
            prevs.append(prev)
            z = base[:, step]
            if d.markov_head is not None:
                bias, state = d.markov_head.step_bias(self._up(torch.from_numpy(prev), log),
                                                      h[:, step], state)
                z = z + self._down(bias.to(base.dtype), log)
            z = z.to(base_logits.dtype).double()
            if hot.any():  # Gumbel-max with the same counter-based noise as the device
                z = gumbel_scores(z, temperature, seed, anchor_pos, step)
            z = z.numpy()
            draft_ids = np.argmax(z, axis=-1)  # numpy: the first maximal index
            second, best = np.partition(z, -2, axis=-1)[:, -2:].T
            near_ties += ~hot & (best - second <= eps * np.abs(best))
            prev = draft_ids if self.d2t is None else draft_ids + self.d2t[draft_ids]
            ids.append(prev)
        prevs_dev = self._up(torch.from_numpy(np.stack(prevs, 1)), log)
        confidences = (None if d.confidence_head is None
                       else self._down(d.confidences(h, prevs_dev), log))
        return HostResult(torch.from_numpy(np.stack(ids, 1)), confidences, log,
                          torch.from_numpy(near_ties))
