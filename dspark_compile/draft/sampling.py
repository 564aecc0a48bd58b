"""How a step's logits become an id: the first-index argmax, Gumbel-max at a temperature,
and the model-dtype rounding the host path applies to the corrected logits."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from dspark_compile.rng import gumbel


def first_argmax(x: Tensor) -> Tensor:
    """``x.argmax(-1)``, the lowest index winning ties, reduced in two stages: the maximum of
    each chunk of a row, then the first chunk holding the row's maximum. Same result; but a
    compiler gives one long row many thread blocks (Inductor does not split an argmax, and
    one block per 248320-wide row serialises each Markov step)."""
    size = x.shape[-1]
    chunk = math.gcd(size, 1024)
    while size // chunk < 4 and chunk > 1:  # at least four chunks: tiny lanes take this path too
        chunk //= 2
    if chunk < 16:
        return x.argmax(-1)
    values, index = x.unflatten(-1, (size // chunk, chunk)).max(-1)
    best = values.argmax(-1, keepdim=True)
    return (best * chunk + index.gather(-1, best)).squeeze(-1)


def rounded(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x`` rounded to ``dtype`` (to nearest, ties to even), kept in ``x``'s dtype.

    bf16 from fp32 is rounded with integer arithmetic on the bits, which no compiler pass
    that simplifies chains of casts can remove: with ``x.to(bf16).double()`` Inductor on
    the H200 (torch 2.11) broke bf16 ties of the logits another way than eager, as if the
    rounding were gone. Other dtypes take the cast round trip (no shipped lane is float16).
    """
    if x.dtype != torch.float32 or dtype != torch.bfloat16:
        return x.to(dtype).to(x.dtype)
    bits = x.view(torch.int32)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -0x10000  # finite values: no NaN here
    return bits.view(torch.float32)


def gumbel_scores(z: Tensor, temperature: Tensor, seed: Tensor, anchor_pos: Tensor,
                  step: int) -> Tensor:
    """Float64 scores whose first-index argmax is the step's id: ``z`` itself where the
    temperature is 0, else Gumbel-max's ``z / T + G`` with counter-based noise. In float64,
    so no backend's rounding of the noise can reorder two candidates."""
    scores = z.double()
    hot = temperature > 0
    noise = gumbel(seed, anchor_pos, step, z.shape[-1])
    scaled = scores / torch.where(hot, temperature, 1.0).double()[:, None] + noise
    return torch.where(hot[:, None], scaled, scores)


def sample(z: Tensor, temperature: Tensor, seed: Tensor, anchor_pos: Tensor, step: int
           ) -> Tensor:
    """The ids of one step: :func:`first_argmax` of :func:`gumbel_scores`."""
    return first_argmax(gumbel_scores(z, temperature, seed, anchor_pos, step))
