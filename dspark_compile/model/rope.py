"""RoPE: inverse frequencies of the scaling types transformers' Qwen3 RoPE supports with a
table fixed per position, and the cos/sin tables the draft step gathers rows of.

A lane carries ``rope_theta`` and ``rope_scaling``: ``None`` (plain RoPE) or a dict with
``rope_type`` and that type's parameters, as transformers 5.x writes them inside
``rope_parameters`` (with ``original_max_position_embeddings`` filled in, so the dict
alone fixes the frequencies). ``dynamic`` and ``longrope`` change the frequencies with the
sequence length: ``dynamic`` keeps the plain frequencies up to the model's
``original_max_position_embeddings``, which the lane's context may not pass
(``LaneConfig``), and ``longrope`` is refused: the draft step's tables are fixed.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import Tensor


def inverse_frequencies(head_dim: int, theta: float, scaling: Optional[dict[str, Any]]
                        ) -> tuple[Tensor, float]:
    """fp32 inverse frequencies ``[head_dim / 2]`` and the factor cos/sin are scaled by."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta ** exponent)
    kind = None if scaling is None else scaling["rope_type"]
    if kind in (None, "dynamic"):
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / scaling["factor"], 1.0
    if kind == "llama3":
        return _llama3(inv_freq, scaling), 1.0
    return _yarn(head_dim, theta, scaling)


def _llama3(inv_freq: Tensor, p: dict[str, Any]) -> Tensor:
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old = p["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) * ~(wavelen > old / low)
    return torch.where(medium, smoothed, scaled)


def _yarn(dim: int, base: float, p: dict[str, Any]) -> tuple[Tensor, float]:
    factor, original = p["factor"], p["original_max_position_embeddings"]

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = p.get("attention_factor")
    if attention is None:
        if p.get("mscale") and p.get("mscale_all_dim"):
            attention = mscale(factor, p["mscale"]) / mscale(factor, p["mscale_all_dim"])
        else:
            attention = mscale(factor)
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    exponent = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    extrapolation = 1.0 / base ** exponent
    interpolation = 1.0 / (factor * base ** exponent)
    extrapolation_weight = 1 - ramp
    inv_freq = interpolation * (1 - extrapolation_weight) + extrapolation * extrapolation_weight
    return inv_freq, float(attention)


def rope_tables(positions: int, head_dim: int, theta: float,
                scaling: Optional[dict[str, Any]] = None) -> tuple[Tensor, Tensor]:
    """NeoX RoPE cos/sin ``[positions, head_dim]`` in float64, computed on the CPU.

    Angles in fp32, as Qwen3 computes them. The draft step gathers rows of these tables
    instead of evaluating cos/sin itself: compilers evaluate them with other libraries
    (Triton's cos differed from CUDA's in the last fp32 bit on the H200), and one flipped
    rounding of a table entry changes every hidden row after it.
    """
    inv_freq, attention = inverse_frequencies(head_dim, theta, scaling)
    angles = torch.arange(positions, dtype=torch.float32)[:, None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1).double()
    return angles.cos() * attention, angles.sin() * attention
