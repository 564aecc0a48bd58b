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

BLOCK = 1024  # vocabulary entries of every position a step of the statistics pass reads
BLOCK_ROW = 4096  # those of one position a step of the correction's passes reads
WARPS = 8


def verify_sampling_fused(drafted: Tensor, q: Tensor, logits: Tensor, rows: Tensor,
                          temperature: float, seed: Tensor, position: Tensor, step: int,
                          lengths: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """``speculative.acceptance.verify_rows`` in one kernel: ``(accepted [R], tokens
    [R, k+1])``, the noise on the stream ``step``."""
    import triton

    from dspark_compile.kernels.verify.kernels import verify_kernel

    R, k, V = len(rows), drafted.shape[1], logits.shape[-1]
    logits, q, drafted = (t if t.stride(-1) == 1 else t.contiguous()
                          for t in (logits, q, drafted))
    accepted = torch.empty(R, dtype=torch.long, device=logits.device)
    tokens = torch.empty(R, k + 1, dtype=torch.long, device=logits.device)
    if R:
        verify_kernel[(R,)](
            drafted, drafted.stride(0), q, q.stride(0), q.stride(1) if k else 0, logits,
            logits.stride(0), logits.stride(1), rows.contiguous(),
            rows if lengths is None else lengths.contiguous(), seed.contiguous(),
            position.contiguous(), accepted, tokens, float(temperature), step, V=V, K=k,
            POSITIONS=triton.next_power_of_2(k + 1), HAS_LENGTHS=lengths is not None,
            BLOCK=BLOCK, BLOCK_ROW=BLOCK_ROW, num_warps=WARPS)
    return accepted, tokens
