"""The draft step on the device: one function of (weights, KV state, this round's inputs).

Context append, the block forward, the k-step Markov loop unrolled in Python, d2t and the
confidences: no ``.item()``, no host tensors, no data-dependent shapes, so a compiler can
capture the whole round as one graph and only ``[R, k]`` ids and confidences leave it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor, nn

from dspark_compile import fused_markov
from dspark_compile.config import LaneConfig
from dspark_compile.errors import InputError
from dspark_compile.model import Drafter
from dspark_compile.model.vocab import to_target
from dspark_compile.rng import gumbel


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
        # the context, the block's scratch rows, one trash slot for padding rows
        slots = (max_context or lane.max_context) + lane.block_rows + 1
        shape = (batch, lane.num_layers, lane.num_kv_heads, slots, lane.head_dim)
        # zeros, not empty: masked slots still enter the attention product, so no NaN there
        return cls(*(torch.zeros(shape, dtype=lane.torch_dtype, device=device) for _ in "kv"))

    def clone(self) -> "KVCache":
        return KVCache(self.k.clone(), self.v.clone())


@dataclass
class RoundInputs:
    """What the target hands the drafter each round.

    features:    ``[R, N, F]`` tapped target hidden states for positions s-n .. s-1 (rows
                 past ``num_new`` are padding; the first round carries the prompt)
    num_new:     ``[R]`` int64, valid rows of ``features``
    anchor:      ``[R]`` int64, the last token the target produced (target vocabulary)
    anchor_pos:  ``[R]`` int64, its position s
    temperature: ``[R]`` float32, 0 drafts greedily (the default)
    seed:        ``[R]`` int64 in [0, 2^32), keys the sampling noise (default 0)
    """

    features: Tensor
    num_new: Tensor
    anchor: Tensor
    anchor_pos: Tensor
    temperature: Optional[Tensor] = None
    seed: Optional[Tensor] = None

    def tensors(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """All six inputs, the defaults filled in."""
        temperature, seed = self.temperature, self.seed
        if temperature is None:
            temperature = torch.zeros(self.anchor.shape, dtype=torch.float32,
                                      device=self.anchor.device)
        if seed is None:
            seed = torch.zeros(self.anchor.shape, dtype=torch.long, device=self.anchor.device)
        return self.features, self.num_new, self.anchor, self.anchor_pos, temperature, seed


@dataclass
class DraftOutput:
    ids: Tensor          # [R, k] int64, target vocabulary
    confidences: Tensor  # [R, k] float32
    probs: Optional[Tensor] = None  # [R, k, V_target] float32 draft distribution q

    def select(self, rows: Tensor) -> "DraftOutput":
        return DraftOutput(*(None if t is None else t[rows]
                             for t in (self.ids, self.confidences, self.probs)))


def first_argmax(x: Tensor) -> Tensor:
    """``x.argmax(-1)``, the lowest index winning ties, reduced in two stages: the maximum of
    each chunk of a row, then the first chunk holding the row's maximum. Same result; but a
    compiler gives one long row many thread blocks (Inductor does not split an argmax: one
    block per 248320-wide row took 0.3 ms per Markov step on the H200)."""
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


def sample(z: Tensor, temperature: Tensor, seed: Tensor, anchor_pos: Tensor, step: int
           ) -> Tensor:
    """Draft ids of one step: the first-index argmax of ``z`` where the temperature is 0,
    else Gumbel-max, ``argmax(z / T + G)``, with counter-based noise. In float64, so no
    backend's rounding of the noise can reorder two candidates."""
    scores = z.double()
    hot = temperature > 0
    noise = gumbel(seed, anchor_pos, step, z.shape[-1])
    scaled = scores / torch.where(hot, temperature, 1.0).double()[:, None] + noise
    return first_argmax(torch.where(hot[:, None], scaled, scores))


def markov_loop(drafter: Drafter, h: Tensor, base_logits: Tensor, anchor: Tensor,
                temperature: Tensor, seed: Tensor, anchor_pos: Tensor,
                keep_logits: bool = True) -> tuple[Tensor, Tensor, Optional[Tensor]]:
    """The Markov walk, unrolled: ids ``[R, k]``, ids fed to each step, and the corrected
    logits ``[R, k, V]`` when ``keep_logits``. A lane with ``fused_markov_step`` runs the
    walk in Triton on CUDA (:mod:`dspark_compile.fused_markov`), which never writes the
    logits."""
    head = drafter.markov_head
    if drafter.lane.fused_markov_step and base_logits.is_cuda and not keep_logits:
        ids = fused_markov.markov_walk(head.markov_w1.weight, head.markov_w2.weight,
                                       base_logits, anchor, temperature, seed, anchor_pos,
                                       drafter.d2t)
        return ids, torch.cat([anchor[:, None], ids[:, :-1]], 1), None
    prev, state = anchor, head.initial_state(h)
    wide = torch.promote_types(base_logits.dtype, torch.float32)
    ids, prevs, logits = [], [], []
    for step in range(base_logits.shape[1]):
        prevs.append(prev)
        bias, state = head.step_bias(prev, h[:, step], state)
        # A model-dtype '+', spelled out (widen, add, round once) so that no compiler
        # folds the add into the bias GEMM, which would skip the rounding of the bias.
        z = rounded(base_logits[:, step].to(wide) + bias.to(wide), bias.dtype)
        prev = to_target(sample(z, temperature, seed, anchor_pos, step), drafter.d2t)
        ids.append(prev)
        logits.append(z.to(bias.dtype))
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


class DraftStep(nn.Module):
    """The module every backend compiles. Mutates the cache in place (the context append).

    Returns ``(ids, confidences, rules)``, plus the draft distribution q when ``with_probs``.
    ``rules`` is :func:`round_rules` of the inputs: a round that breaks one runs inert (no
    new context, the anchor at the context capacity, nothing indexed out of range), so the
    caller can check it after the round, in the same host sync as the ids.
    """

    def __init__(self, drafter: Drafter, with_probs: bool = False):
        super().__init__()
        self.drafter = drafter
        self.with_probs = with_probs

    def forward(self, k_cache: Tensor, v_cache: Tensor, features: Tensor, num_new: Tensor,
                anchor: Tensor, anchor_pos: Tensor, temperature: Tensor, seed: Tensor
                ) -> tuple[Tensor, ...]:
        d = self.drafter
        slots = k_cache.shape[-2]
        rules = round_rules(d.lane, slots, features, num_new, anchor, anchor_pos,
                            temperature, seed)
        ok = rules.all()
        num_new, anchor, seed = (t.where(ok, 0) for t in (num_new, anchor, seed))
        anchor_pos = anchor_pos.where(ok, context_capacity(d.lane, slots))
        temperature = temperature.where(ok, 0.0)
        d.append_context(k_cache, v_cache, features, num_new, anchor_pos)
        h, base_logits = d(k_cache, v_cache, anchor, anchor_pos)
        ids, prevs, logits = markov_loop(d, h, base_logits, anchor, temperature, seed,
                                         anchor_pos, keep_logits=self.with_probs)
        confidences = d.confidences(h, prevs)
        if self.with_probs:
            return ids, confidences, rules, draft_probs(d, logits, ids, temperature)
        return ids, confidences, rules


@torch.no_grad()
def draft(drafter: Drafter, cache: KVCache, inputs: RoundInputs,
          with_probs: bool = False) -> DraftOutput:
    """One eager draft round on the device, after checking the inputs."""
    check_round(drafter.lane, cache, inputs)
    ids, confidences, _, *probs = DraftStep(drafter, with_probs)(cache.k, cache.v,
                                                                *inputs.tensors())
    return DraftOutput(ids, confidences, *probs)


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


# the input each rule of round_rules is about, in its order
RULES = ("anchor", "num_new", "anchor_pos", "anchor_pos", "features", "temperature", "seed")


def round_rules(lane: LaneConfig, slots: int, features: Tensor, num_new: Tensor,
                anchor: Tensor, anchor_pos: Tensor, temperature: Tensor, seed: Tensor
                ) -> Tensor:
    """Whether the round keeps each of the value rules :func:`check_rules` names, as a bool
    vector on the inputs' device: no host sync, so the draft step itself can compute it and
    :func:`check_round` can say which rule failed."""
    max_context = context_capacity(lane, slots)
    valid = torch.arange(features.shape[1], device=features.device)[None, :] < num_new[:, None]
    # a float64 row sum is finite exactly when the row is (no overflow from bf16/fp32
    # values), and takes no [R, N, F] temporary: prompts can be gigabytes
    row_sums = features.sum(-1, dtype=torch.float64)
    return torch.stack([
        ((anchor >= 0) & (anchor < lane.target_vocab_size)).all(),
        ((num_new >= 0) & (num_new <= features.shape[1])).all(),
        (anchor_pos >= num_new).all(),  # compared, not subtracted: no int64 wrap
        (anchor_pos <= max_context).all(),
        torch.where(valid, row_sums, 0).isfinite().all(),
        ((temperature >= 0) & (temperature < math.inf)).all(),  # NaN fails both
        ((seed >= 0) & (seed < 1 << 32)).all(),
    ])


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
        return int((valid & ~torch.isfinite(features.sum(-1, dtype=torch.float64))).sum())

    messages = [  # (what was found, what is allowed), per rule
        (lambda: f"values in {_span(anchor)}", f"[0, {lane.target_vocab_size})"),
        (lambda: f"values in {_span(num_new)}", f"[0, {N}] (rows of features)"),
        (lambda: f"{int((anchor_pos < num_new).sum())} rows below num_new",
         "anchor_pos >= num_new"),
        (lambda: f"up to {anchor_pos.max()}",
         f"<= {context_capacity(lane, slots)} (the context capacity of the cache and the "
         "lane)"),
        (lambda: f"NaN or Inf in {bad_rows()} of the rows that num_new marks valid",
         "finite values (padding rows may hold anything)"),
        (lambda: f"{((temperature < 0) | ~torch.isfinite(temperature)).sum()} negative, NaN "
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
