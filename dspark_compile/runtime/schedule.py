"""Which drafted tokens a round verifies: per request, the prefix worth its cost, from the
drafter's confidences and the target's verify throughput (DSpark's confidence scheduling).

With calibrated confidences ``c[r, j]`` (the chance draft j survives given that the drafts
before it did), draft j of request r survives with ``a[r, j] = prod_{i<=j} c[r, i]``.
Verify lengths ``l[r]`` cost a target step of ``B = sum_r (1 + l[r])`` tokens and yield
``tau = sum_r (1 + sum_{j<l[r]} a[r, j])`` tokens in expectation; the target runs
``SPS(B)`` such steps a second. :func:`verify_lengths` (Algorithm 1) admits the drafts in
order of ``a``, best first, while ``tau * SPS(B)`` grows, and stops at the first that does
not. A target that pads every row to the widest (no ragged batches) charges a step by its
width instead: there :func:`verify_width` is exact, every row verifying the same number of
drafts, the one that maximises ``tau * SPS(width)``. Both are tensor code of fixed shapes
with no host synchronisation, so they run inside a captured graph. :class:`LaggedSchedule`
(DSpark's production variant) runs them on the host over each request's confidences of
rounds before.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor


@dataclass(frozen=True)
class StepsPerSecond:
    """``SPS(B)``: the target's verify steps per second with ``B`` tokens in a step,
    measured at some ``B`` (ascending) and linear between them, flat past the ends.
    ``by``: how the target charges a step: ``"tokens"``, by all the tokens in it (ragged
    rows; Algorithm 1), or ``"width"``, by its widest row, every row padded to it
    (``tokens`` then counts one row's; :func:`verify_width`)."""

    tokens: tuple[int, ...]
    steps_per_second: tuple[float, ...]
    by: str = "tokens"

    def __post_init__(self):
        if self.by not in ("tokens", "width"):
            raise ValueError(f"StepsPerSecond: by={self.by!r}, expected 'tokens' or 'width'")
        if not self.tokens or len(self.tokens) != len(self.steps_per_second):
            raise ValueError("StepsPerSecond: one rate for each token count, at least one")
        if list(self.tokens) != sorted(set(self.tokens)) or self.tokens[0] < 1:
            raise ValueError(f"StepsPerSecond: token counts {self.tokens} must ascend from 1")
        if min(self.steps_per_second) <= 0:
            raise ValueError("StepsPerSecond: rates must be positive")

    def __call__(self, tokens: Tensor) -> Tensor:
        xs = torch.tensor(self.tokens, dtype=torch.float64, device=tokens.device)
        ys = torch.tensor(self.steps_per_second, dtype=torch.float64, device=tokens.device)
        if len(xs) == 1:
            return ys.expand(tokens.shape).clone()
        t = tokens.double().clamp(xs[0], xs[-1])
        right = torch.searchsorted(xs, t, right=True).clamp(1, len(xs) - 1)
        x0, x1, y0, y1 = xs[right - 1], xs[right], ys[right - 1], ys[right]
        return y0 + (y1 - y0) * (t - x0) / (x1 - x0)

    def padded(self) -> "StepsPerSecond":
        """The rates of a target that runs a step of ``B`` tokens as its fastest measured
        step of at least ``B`` (padding the rest): never slower at more tokens."""
        best = [max(self.steps_per_second[i:]) for i in range(len(self.tokens))]
        return replace(self, steps_per_second=tuple(best))

    def with_overhead(self, seconds: float) -> "StepsPerSecond":
        """The rates of a whole round: each step also spends ``seconds`` outside the
        target's pass (the draft, the host's work), whatever its tokens. Algorithm 1 over
        these weighs tokens against the round's time, not the pass's alone."""
        if seconds < 0:
            raise ValueError(f"StepsPerSecond: overhead {seconds} s must be >= 0")
        return replace(self, steps_per_second=tuple(1.0 / (1.0 / rate + seconds)
                                                    for rate in self.steps_per_second))

    def table(self, tokens: int, device: torch.device | str = "cpu") -> Tensor:
        """``SPS`` at 0, 1, .. ``tokens`` tokens ``[tokens + 1]`` (float64): what
        :func:`verify_lengths` and :func:`verify_width` read, made once where they run in a
        captured graph."""
        return self(torch.arange(tokens + 1, device=device))

    def lengths(self, confidences: Tensor, live: Optional[Tensor] = None) -> Tensor:
        """The verify lengths this target's charging calls for: :func:`verify_lengths` or
        :func:`verify_width`."""
        return scheduler(self.by)(confidences, self, live)


def scheduler(by: str) -> Callable[..., Tensor]:
    """The schedule for a target that charges a step ``by`` its tokens or its width."""
    return verify_width if by == "width" else verify_lengths


class LaggedSchedule:
    """DSpark's production variant (section 5.2): each request's verify lengths from its own
    confidences of ``lag`` rounds before, which an engine holds before the round's draft is
    done; a request with no round that old verifies every draft. Kept per slot on the host,
    where each round's confidences already are: the lengths need no device work."""

    def __init__(self, sps: StepsPerSecond, lag: int, k: int, requests: int):
        self.rates = sps.table(requests * (k + 1))
        self.schedule, self.lag, self.k = scheduler(sps.by), lag, k
        self.history: dict[int, deque[Tensor]] = {}  # slot -> its last ``lag`` rounds'

    def __call__(self, slots: Sequence[int], confidences: Tensor) -> Tensor:
        """The lengths ``[R]`` of a round of ``slots``, whose confidences ``[R, k]`` (on the
        host) then join their history."""
        histories = [self.history.setdefault(slot, deque(maxlen=self.lag)) for slot in slots]
        fresh = torch.tensor([len(h) < self.lag for h in histories])
        old = torch.stack([h[0] if len(h) == self.lag else torch.ones(self.k)
                           for h in histories]).to(confidences.dtype)
        for h, c in zip(histories, confidences):
            h.append(c.clone())
        return self.schedule(old, self.rates).masked_fill(fresh, self.k)

    def forget(self, slot: int) -> None:
        self.history.pop(slot, None)


def with_lengths(step: Callable, lengths: Callable) -> Callable:
    """``step`` taking two buffers more (the rows in the round, the SPS table) and returning
    the verify lengths that ``lengths`` schedules after the ids: a draft step with its
    schedule, in one graph."""
    def run(*args: Tensor) -> tuple[Tensor, ...]:
        *inputs, live, rates = args
        ids, confidences, rules, *rest = step(*inputs)
        return (ids, lengths(confidences, rates, live), confidences, rules, *rest)
    return run


def profile_steps_per_second(verify_step: Callable[[int], None], tokens: Sequence[int],
                             repeats: int = 20, warmup: int = 3) -> StepsPerSecond:
    """``SPS`` measured: ``verify_step(B)`` runs one target step of ``B`` tokens and returns
    when it is done (on a GPU, after a synchronisation); the median of ``repeats`` at each
    ``B``."""
    rates = []
    for count in tokens:
        for _ in range(warmup):
            verify_step(count)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            verify_step(count)
            times.append(time.perf_counter() - start)
        rates.append(1.0 / sorted(times)[len(times) // 2])
    return StepsPerSecond(tuple(tokens), tuple(rates))


def verify_lengths(confidences: Tensor, sps: StepsPerSecond | Tensor,
                   live: Optional[Tensor] = None) -> Tensor:
    """Algorithm 1: each request's verify length ``[R]`` (0 .. k) for confidences
    ``[R, k]``. ``sps``: the table, or :meth:`StepsPerSecond.table` of at least ``R (k+1)``
    tokens. ``live [R]`` (bool): the rows in the round (the rest are neither counted nor
    verified). Survivals fall along a row, so admitting them best first (ties in row
    order) admits a prefix of each row."""
    R, k = confidences.shape
    rates = sps.table(R * (k + 1), confidences.device) if isinstance(sps, StepsPerSecond) \
        else sps
    survival = confidences.double().clamp(0, 1).cumprod(-1)
    requests = R
    if live is not None:
        survival = survival * live[:, None]
        requests = live.sum()
    survival = survival.flatten()
    order = survival.argsort(descending=True, stable=True)
    gained = torch.cat([survival.new_zeros(1), survival[order].cumsum(0)])
    admitted = torch.arange(R * k + 1, device=confidences.device)
    value = (requests + gained) * rates[requests + admitted]
    # the admissions before the first that does not raise tau * SPS(B)
    count = (value[1:] > value[:-1]).long().cumprod(0).sum()
    taken = (admitted[:-1] < count).long()
    lengths = torch.zeros(R, dtype=torch.long, device=confidences.device).scatter_add(
        0, order // k, taken)
    return lengths if live is None else lengths * live


def verify_width(confidences: Tensor, sps: StepsPerSecond | Tensor,
                 live: Optional[Tensor] = None) -> Tensor:
    """The verify lengths ``[R]`` for a target that runs every row as wide as the widest:
    all live rows the same number of drafts (a wider pass costs each row the same, so every
    row takes what the width allows), the number ``d`` of 0 .. k that maximises
    ``tau(d) * SPS(d + 1)``, the fewest among equals. ``sps``: by width, or its
    :meth:`StepsPerSecond.table` of at least ``k + 1`` tokens a row."""
    R, k = confidences.shape
    rates = sps.table(k + 1, confidences.device) if isinstance(sps, StepsPerSecond) else sps
    survival = confidences.double().clamp(0, 1).cumprod(-1)
    requests = R
    if live is not None:
        survival = survival * live[:, None]
        requests = live.sum()
    gained = torch.cat([survival.new_zeros(1), survival.sum(0).cumsum(0)])  # [k + 1]
    drafts = ((requests + gained) * rates[1:k + 2]).argmax()
    lengths = drafts.expand(R)
    return lengths.clone() if live is None else lengths * live


@dataclass(frozen=True)
class PositionTemperatures:
    """STS: a temperature per draft position on the confidence's logit,
    ``sigmoid(logit(c[:, j]) / T[j])``, fitted by :func:`fit_position_temperatures`."""

    temperatures: tuple[float, ...]

    def __call__(self, confidences: Tensor) -> Tensor:
        t = torch.tensor(self.temperatures, dtype=torch.float64, device=confidences.device)
        c = confidences.double().clamp(1e-12, 1 - 1e-12)
        return torch.sigmoid(torch.logit(c) / t).to(confidences.dtype)


def calibration_error(predicted: Tensor, happened: Tensor, bins: int = 10) -> float:
    """Expected calibration error: over equal-width bins of the predicted chance, the gap
    between its mean and the observed rate, weighted by the bin's share."""
    predicted, happened = predicted.double().flatten(), happened.double().flatten()
    which = (predicted * bins).long().clamp(0, bins - 1)
    gap = (predicted.new_zeros(bins).index_add_(0, which, predicted)
           - predicted.new_zeros(bins).index_add_(0, which, happened)).abs()
    return float(gap.sum() / max(len(predicted), 1))


def survival_errors(confidences: Tensor, accepted: Tensor) -> list[float]:
    """Per position j, the calibration error of the survival ``prod_{i<=j} c[:, i]``
    against what happened (``accepted > j``), over rounds ``confidences [N, k]`` that
    accepted ``accepted [N]`` drafts each."""
    survival = confidences.double().cumprod(-1)
    return [calibration_error(survival[:, j], accepted > j) for j in range(survival.shape[1])]


def log_loss(predicted: Tensor, happened: Tensor) -> float:
    """The mean negative log-likelihood of what happened under the predicted chances."""
    p, y = predicted.double().clamp(1e-12, 1 - 1e-12), happened.double()
    return float(-(y * p.log() + (1 - y) * (1 - p).log()).mean())


FIT_CRITERIA = ("log_loss", "calibration_error")


def fit_position_temperatures(confidences: Tensor, accepted: Tensor,
                              grid: Sequence[float] = tuple(0.25 * 1.1 ** i for i in range(40)),
                              criterion: str = "log_loss") -> PositionTemperatures:
    """STS from recorded rounds (their confidences ``[N, k]`` and drafts accepted ``[N]``):
    each position's temperature in turn, left to right, the one of ``grid`` (1 among them)
    whose cumulative product best predicts the drafts that survived there, the earlier
    positions' already applied. ``criterion``: the survival's ``log_loss`` (smooth in the
    temperature), or its binned ``calibration_error`` (the paper's; with a few hundred
    rounds it fits the bins' noise and can raise the error on other rounds)."""
    if criterion not in FIT_CRITERIA:
        raise ValueError(f"fit_position_temperatures: criterion={criterion!r}, expected one "
                         f"of {FIT_CRITERIA}")
    measure = log_loss if criterion == "log_loss" else calibration_error
    fitted: list[float] = []
    k = confidences.shape[1]
    for j in range(k):
        def error(t: float) -> float:
            scaled = PositionTemperatures(tuple(fitted) + (t,) * (k - j))(confidences)
            return measure(scaled[:, :j + 1].double().cumprod(-1)[:, j], accepted > j)
        fitted.append(min([1.0, *grid], key=error))
    return PositionTemperatures(tuple(fitted))
