"""The rules a round's inputs must keep: shapes, dtypes and devices on the host, values as a
bool vector the draft step computes itself (so a compiled round checks them in its graph)."""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

from dspark_compile.config import LaneConfig
from dspark_compile.draft.inputs import KVCache, RoundInputs
from dspark_compile.errors import InputError

# the input each rule of round_rules is about, in its order
RULES = ("anchor", "num_new", "anchor_pos", "anchor_pos", "features", "temperature", "seed")


def check_round(lane: LaneConfig, cache: KVCache, inputs: RoundInputs) -> None:
    """Raise :class:`InputError` for any input the draft step cannot take (one host sync)."""
    check_shapes(lane, cache, inputs)
    slots = cache.k.shape[-2]
    check_rules(lane, slots, inputs, round_rules(lane, slots, *inputs.tensors()).tolist())


def check_shapes(lane: LaneConfig, cache: KVCache, inputs: RoundInputs) -> None:
    """Types, shapes, dtypes and devices: the half of :func:`check_round` on the host."""
    R = check_input_shapes(lane, inputs, cache.k.device)
    slots = cache.k.shape[-2]
    want_cache = (R, lane.num_layers, lane.num_kv_heads, slots, lane.head_dim)
    for name, t in (("cache.k", cache.k), ("cache.v", cache.v)):
        _expect(name, t, want_cache, lane.torch_dtype, cache.k.device)
    if slots < lane.block_rows + 2:
        raise InputError("cache.k", f"{slots} slots", f">= {lane.block_rows + 2}")


def check_input_shapes(lane: LaneConfig, inputs: RoundInputs, device: torch.device) -> int:
    """The inputs' types, shapes, dtypes and devices (``device``: the cache's); returns
    their request count."""
    features = inputs.features
    if not isinstance(features, Tensor) or features.dim() != 3 or features.shape[0] == 0:
        raise InputError("features", f"shape {tuple(getattr(features, 'shape', ()))}",
                         "[R, N, feature_size] with R >= 1")
    R, N = features.shape[:2]
    _expect("features", features, (R, N, lane.feature_size), lane.torch_dtype, device)
    for name, t in (("num_new", inputs.num_new), ("anchor", inputs.anchor),
                    ("anchor_pos", inputs.anchor_pos)):
        _expect(name, t, (R,), torch.int64, device)
    # None is the default (zeros): nothing to check, and nothing allocated to check it
    if inputs.temperature is not None:
        _expect("temperature", inputs.temperature, (R,), torch.float32, device)
    if inputs.seed is not None:
        _expect("seed", inputs.seed, (R,), torch.int64, device)
    return R


def context_capacity(lane: LaneConfig, slots: int) -> int:
    """The largest anchor position a cache of ``slots`` slots takes on this lane."""
    return min(slots - lane.block_rows - 1, lane.max_context)


def round_rules(lane: LaneConfig, slots: int, features: Tensor, num_new: Tensor,
                anchor: Tensor, anchor_pos: Tensor, temperature: Tensor, seed: Tensor
                ) -> Tensor:
    """Whether the round keeps each of the value rules :func:`check_rules` names, as a bool
    vector on the inputs' device: no host sync, so the draft step itself can compute it and
    :func:`check_round` can say which rule failed."""
    max_context = context_capacity(lane, slots)
    valid = torch.arange(features.shape[1], device=features.device)[None, :] < num_new[:, None]
    return torch.stack([
        ((anchor >= 0) & (anchor < lane.target_vocab_size)).all(),
        ((num_new >= 0) & (num_new <= features.shape[1])).all(),
        (anchor_pos >= num_new).all(),  # compared, not subtracted: no int64 wrap
        (anchor_pos <= max_context).all(),
        (finite_rows(features) | ~valid).all(),
        ((temperature >= 0) & (temperature < math.inf)).all(),  # NaN fails both
        ((seed >= 0) & (seed < 1 << 32)).all(),
    ])


def finite_rows(features: Tensor) -> Tensor:
    """Whether each row of ``features`` [R, N, F] is finite, as [R, N]: exactly when its max
    and min are (both propagate NaN). Two reductions, no [R, N, F] temporary: prompts can be
    tens of gigabytes."""
    return features.amax(-1).isfinite() & features.amin(-1).isfinite()


def check_rules(lane: LaneConfig, slots: int, inputs: RoundInputs,
                kept: Sequence[bool]) -> None:
    """Raise the :class:`InputError` of the first rule of :func:`round_rules` that ``inputs``
    broke; ``kept`` may come from a round that holds them plus inert rows. Messages use
    exact values, computed only when a rule is broken."""
    if all(kept):
        return
    features, num_new, anchor, anchor_pos, temperature, seed = inputs.tensors()
    N = features.shape[1]

    def bad_rows() -> int:
        valid = torch.arange(N, device=features.device)[None, :] < num_new[:, None]
        return int((valid & ~finite_rows(features)).sum())

    messages = [  # (what was found, what is allowed), per rule
        (lambda: f"values in {_span(anchor)}", f"[0, {lane.target_vocab_size})"),
        (lambda: f"values in {_span(num_new)}", f"[0, {N}] (rows of features)"),
        (lambda: f"{int((anchor_pos < num_new).sum())} rows below num_new",
         "anchor_pos >= num_new"),
        (lambda: f"up to {int(anchor_pos.max())}",
         f"<= {context_capacity(lane, slots)} (the context capacity of the cache and the "
         "lane)"),
        (lambda: f"NaN or Inf in {bad_rows()} of the rows that num_new marks valid",
         "finite values (padding rows may hold anything)"),
        (lambda: f"{int(((temperature < 0) | ~torch.isfinite(temperature)).sum())} negative, NaN "
                 "or infinite values", "0 (greedy) or a finite positive number"),
        (lambda: f"values in {_span(seed)}", "[0, 2^32)"),
    ]
    for name, (found, allowed), ok in zip(RULES, messages, kept, strict=True):
        if not ok:
            raise InputError(name, found(), allowed)


def _span(t: Tensor) -> str:
    return f"[{int(t.min())}, {int(t.max())}]"


def _expect(name: str, t: Tensor, shape: tuple[int, ...], dtype: torch.dtype,
            device: torch.device) -> None:
    if not isinstance(t, Tensor):
        raise InputError(name, f"a {type(t).__name__}", "a torch.Tensor")
    if tuple(t.shape) != tuple(shape):
        raise InputError(name, f"shape {tuple(t.shape)}", f"shape {tuple(shape)}")
    if t.dtype != dtype:
        raise InputError(name, f"dtype {t.dtype}", f"dtype {dtype}")
    if t.device != device:
        raise InputError(name, f"device {t.device}", f"device {device} (the cache's)")
