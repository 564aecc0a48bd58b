"""Sampled verification in one launch, for the speculative loop (which runs eagerly on the
device): the target's softmax at the drafted positions, the accepted prefix and the token
after it, where the tensor ops of ``speculative.acceptance`` are some forty launches a
round, each a few elements wide, and a copy of the rows' logits.

It draws the verifier's noise with the noise kernel's hash, so it makes the tensor ops'
decisions; its softmax sums in another order than torch's, so a probability may differ in
its last bits, which changes a decision only where the noise falls within them.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

STATS_BLOCK = 8192  # logits a step of the statistics pass reads, over every position
BLOCK_ROW = 4096  # those of one position a step of the correction's passes reads
WARPS = 8


def positions(k: int) -> int:
    """The kernel's positions for ``k`` drafts: k + 1 rounded up to a power of two, at least
    8, so that one compile serves every verify width of a drafter of up to 7."""
    return max(8, 1 << k.bit_length())


def verify_sampling_fused(drafted: Tensor, q: Tensor, logits: Tensor, rows: Tensor,
                          temperature: float, seed: Tensor, position: Tensor, step: int,
                          lengths: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """``speculative.acceptance.verify_rows`` in one kernel: ``(accepted [R], tokens
    [R, k+1])``, the noise on the stream ``step``."""
    from dspark_compile.kernels.verify.kernels import verify_kernel

    R, k, V = len(rows), drafted.shape[1], logits.shape[-1]
    logits, q, drafted = (t if t.stride(-1) == 1 else t.contiguous()
                          for t in (logits, q, drafted))
    accepted = torch.empty(R, dtype=torch.long, device=logits.device)
    tokens = torch.empty(R, k + 1, dtype=torch.long, device=logits.device)
    if R:
        verify_kernel[(R,)](
            drafted, drafted.stride(0), q, q.stride(0), q.stride(1), logits,
            logits.stride(0), logits.stride(1), rows.contiguous(),
            rows if lengths is None else lengths.contiguous(), seed.contiguous(),
            position.contiguous(), accepted, tokens, float(temperature), step, k, V=V,
            POSITIONS=positions(k),
            HAS_LENGTHS=lengths is not None,
            BLOCK=STATS_BLOCK // positions(k), BLOCK_ROW=BLOCK_ROW, num_warps=WARPS)
    return accepted, tokens
