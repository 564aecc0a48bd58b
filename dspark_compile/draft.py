"""The draft step on the device: one function of (weights, KV state, this round's inputs).

Context append, the block forward, the k-step Markov loop unrolled in Python, d2t and the
confidences: no ``.item()``, no host tensors, no data-dependent shapes, so a compiler can
capture the whole round as one graph and only ``[R, k]`` ids and confidences leave it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from dspark_compile.config import LaneConfig
from dspark_compile.errors import InputError
from dspark_compile.model import Drafter
from dspark_compile.model.vocab import to_target


@dataclass
class KVCache:
    """Context keys and values ``[R, layers, kv_heads, slots, head_dim]``; slot = position.

    Requests are the outer dimension, so the first b rows of a cache are a contiguous cache
    of batch b (what a bucket of a compiled draft step takes).
    """

    k: Tensor
    v: Tensor

    @classmethod
    def allocate(cls, lane: LaneConfig, batch: int, device: torch.device | str,
                 max_context: Optional[int] = None) -> "KVCache":
        slots = (max_context or lane.max_context) + lane.block_rows + 1
        shape = (batch, lane.num_layers, lane.num_kv_heads, slots, lane.head_dim)
        # zeros, not empty: masked slots still enter the attention product, so no NaN there
        return cls(*(torch.zeros(shape, dtype=lane.torch_dtype, device=device) for _ in "kv"))

    def clone(self) -> "KVCache":
        return KVCache(self.k.clone(), self.v.clone())


@dataclass
class RoundInputs:
    """What the target hands the drafter each round.

    features:   ``[R, N, F]`` tapped target hidden states for positions s-n .. s-1 (rows
                past ``num_new`` are padding; the first round carries the prompt)
    num_new:    ``[R]`` int64, valid rows of ``features``
    anchor:     ``[R]`` int64, the last token the target produced (target vocabulary)
    anchor_pos: ``[R]`` int64, its position s
    """

    features: Tensor
    num_new: Tensor
    anchor: Tensor
    anchor_pos: Tensor

    def to(self, device: torch.device | str) -> "RoundInputs":
        return RoundInputs(*(t.to(device) for t in self.tensors()))

    def tensors(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return self.features, self.num_new, self.anchor, self.anchor_pos


@dataclass
class DraftOutput:
    ids: Tensor          # [R, k] int64, target vocabulary
    confidences: Tensor  # [R, k] float32
    logits: Optional[Tensor] = None  # [R, k, V_draft] corrected logits, model dtype

    def select(self, rows: Tensor) -> "DraftOutput":
        return DraftOutput(*(None if t is None else t[rows]
                             for t in (self.ids, self.confidences, self.logits)))


def markov_loop(drafter: Drafter, h: Tensor, base_logits: Tensor, anchor: Tensor
                ) -> tuple[Tensor, Tensor, Tensor]:
    """Greedy Markov walk, unrolled: ids ``[R, k]``, ids fed to each step, corrected logits."""
    head = drafter.markov_head
    prev, state = anchor, head.initial_state(h)
    wide = torch.promote_types(base_logits.dtype, torch.float32)
    ids, prevs, logits = [], [], []
    for step in range(base_logits.shape[1]):
        bias, state = head.step_bias(prev, h[:, step], state)
        # A model-dtype '+', spelled out (widen, add, round once) so that no compiler folds
        # the add into the bias GEMM, which would skip the rounding of the bias itself.
        z = (base_logits[:, step].to(wide) + bias.to(wide)).to(bias.dtype)
        prevs.append(prev)
        prev = to_target(z.argmax(dim=-1), drafter.d2t)  # argmax: the lowest index wins ties
        ids.append(prev)
        logits.append(z)
    return torch.stack(ids, 1), torch.stack(prevs, 1), torch.stack(logits, 1)


class DraftStep(nn.Module):
    """The module every backend compiles. Mutates the cache in place (the context append)."""

    def __init__(self, drafter: Drafter, with_logits: bool = False):
        super().__init__()
        self.drafter = drafter
        self.with_logits = with_logits

    def forward(self, k_cache: Tensor, v_cache: Tensor, features: Tensor, num_new: Tensor,
                anchor: Tensor, anchor_pos: Tensor) -> tuple[Tensor, ...]:
        d = self.drafter
        d.append_context(k_cache, v_cache, features, num_new, anchor_pos)
        h, base_logits = d(k_cache, v_cache, anchor, anchor_pos)
        ids, prevs, logits = markov_loop(d, h, base_logits, anchor)
        confidences = d.confidences(h, prevs)
        return (ids, confidences, logits) if self.with_logits else (ids, confidences)


@torch.no_grad()
def draft(drafter: Drafter, cache: KVCache, inputs: RoundInputs,
          with_logits: bool = False) -> DraftOutput:
    """One eager draft round on the device, after checking the inputs."""
    check_round(drafter.lane, cache, inputs)
    return DraftOutput(*DraftStep(drafter, with_logits)(cache.k, cache.v, *inputs.tensors()))


def check_round(lane: LaneConfig, cache: KVCache, inputs: RoundInputs) -> None:
    """Raise :class:`InputError` for any input the draft step cannot take (one host sync)."""
    features, num_new, anchor, anchor_pos = inputs.tensors()
    if not isinstance(features, Tensor) or features.dim() != 3 or features.shape[0] == 0:
        raise InputError("features", f"shape {tuple(getattr(features, 'shape', ()))}",
                         "[R, N, feature_size] with R >= 1")
    R, N = features.shape[:2]
    device, slots = cache.k.device, cache.k.shape[-2]
    want_cache = (R, lane.num_layers, lane.num_kv_heads, slots, lane.head_dim)
    for name, t in (("cache.k", cache.k), ("cache.v", cache.v)):
        _expect(name, t, want_cache, lane.torch_dtype, device)
    if slots < lane.block_rows + 2:
        raise InputError("cache.k", f"{slots} slots", f">= {lane.block_rows + 2}")
    _expect("features", features, (R, N, lane.feature_size), lane.torch_dtype, device)
    for name, t in (("num_new", num_new), ("anchor", anchor), ("anchor_pos", anchor_pos)):
        _expect(name, t, (R,), torch.int64, device)
    max_context = slots - lane.block_rows - 1
    valid = torch.arange(N, device=device)[None, :, None] < num_new[:, None, None]
    nonfinite = (valid & ~torch.isfinite(features)).sum()
    a_lo, a_hi, n_lo, n_hi, start_lo, s_hi, bad = torch.stack([
        anchor.min(), anchor.max(), num_new.min(), num_new.max(),
        (anchor_pos - num_new).min(), anchor_pos.max(), nonfinite]).tolist()
    checks = [
        ("anchor", 0 <= a_lo and a_hi < lane.target_vocab_size, f"values in [{a_lo}, {a_hi}]",
         f"[0, {lane.target_vocab_size})"),
        ("num_new", 0 <= n_lo and n_hi <= N, f"values in [{n_lo}, {n_hi}]",
         f"[0, {N}] (rows of features)"),
        ("anchor_pos", start_lo >= 0, f"anchor_pos - num_new down to {start_lo}",
         "anchor_pos >= num_new"),
        ("anchor_pos", s_hi <= max_context, f"up to {s_hi}",
         f"<= {max_context} (the cache's context capacity)"),
        ("features", bad == 0, f"NaN or Inf in {bad} values of rows that num_new marks valid",
         "finite values (padding rows may hold anything)"),
    ]
    for name, ok, found, allowed in checks:
        if not ok:
            raise InputError(name, found, allowed)


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
