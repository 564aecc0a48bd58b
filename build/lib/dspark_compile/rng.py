"""Counter-based noise for sampling inside the graph.

A 32-bit integer hash of ``(seed, position, step, vocabulary index)`` in plain tensor ops
(multiply, xor, floor-divide: no bit shifts, no torch RNG state, no overflow of int64), so
the host path, the eager device path and every compiled backend draw the same noise and no
generator lives in a graph.
"""

from __future__ import annotations

import torch
from torch import Tensor

MASK = (1 << 32) - 1


def _mix(x: Tensor) -> Tensor:
    """A 32-bit avalanche mix of int64 values in [0, 2^32); multipliers < 2^31 keep every
    product below 2^63."""
    x = x ^ torch.div(x, 1 << 16, rounding_mode="floor")
    x = (x * 0x7FEB352D) & MASK
    x = x ^ torch.div(x, 1 << 15, rounding_mode="floor")
    x = (x * 0x5BD1E995) & MASK
    return x ^ torch.div(x, 1 << 16, rounding_mode="floor")


def uniform(seed: Tensor, position: Tensor, step: int, size: int) -> Tensor:
    """``[R, size]`` float64 in (0, 1), a pure function of its arguments.

    ``seed`` and ``position`` are ``[R]`` int64; ``step`` tells the draft steps apart.
    """
    h = _mix(seed & MASK)
    h = _mix(h ^ (position & MASK))
    h = _mix(h ^ step)
    index = torch.arange(size, device=seed.device)
    h = _mix(h[:, None] ^ index[None, :])
    return (h.double() + 0.5) / float(1 << 32)


def gumbel(seed: Tensor, position: Tensor, step: int, size: int) -> Tensor:
    """Standard Gumbel noise ``[R, size]`` (float64): ``argmax(logits / T + noise)`` samples
    ``softmax(logits / T)``."""
    return -torch.log(-torch.log(uniform(seed, position, step, size)))
