"""What ``e2e.py``'s scheduled arms need around the package's scheduling: STS fitted on a
run's rounds, the target's SPS profiled per verify width (and the width each pass is
fastest at), its prefill's cost in passes (the refill wait), fixed verify lengths, and a
check of sampled verification on real rounds."""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator

import torch
from torch import Tensor

from dspark_compile.runtime.schedule import (PositionTemperatures, StepsPerSecond,
                                             fit_position_temperatures,
                                             profile_steps_per_second, survival_errors)
from dspark_compile.speculative import acceptance, loop
from alone import sync
from llama import LlamaTarget, StaticLlama


def calibration(run: dict) -> tuple[PositionTemperatures, dict]:
    """STS fitted on the first half of ``run``'s rounds; the calibration error per position
    on the other half before and after it (and after STS fitted by the paper's criterion,
    the binned calibration error)."""
    confidences, accepted = torch.tensor(run["confidences"]), torch.tensor(run["accepted"])
    half = len(accepted) // 2
    fit, held = (confidences[:half], accepted[:half]), (confidences[half:], accepted[half:])
    sts = fit_position_temperatures(*fit)
    binned = fit_position_temperatures(*fit, criterion="calibration_error")
    return sts, dict(sts=sts.temperatures, calibration_error=survival_errors(*held),
                     calibration_error_sts=survival_errors(sts(held[0]), held[1]),
                     calibration_error_sts_binned=survival_errors(binned(held[0]), held[1]))


def steps_per_second(model, batch: int, graphs: bool, k: int, taps, slots: int, device
                     ) -> StepsPerSecond:
    """The target's SPS, profiled at every verify width of ``batch`` rows."""
    target = LlamaTarget(model, batch, slots, taps, k + 1, graphs)
    start = torch.zeros(batch, dtype=torch.long, device=device)

    def verify_step(tokens: int) -> None:
        target.verify(torch.zeros(batch, tokens // batch, dtype=torch.long, device=device),
                      start)
        sync()
    return profile_steps_per_second(verify_step, [batch * n for n in range(1, k + 2)])


def prefill_of(model, batch: int, taps, slots: int, prompt: list[int]
               ) -> Callable[[int], None]:
    """A prefill of ``n`` copies of ``prompt`` into the first rows of the target's ``batch``
    rows, as :func:`prefill_passes` times it."""
    llama = StaticLlama(model, batch, slots, taps)

    def prefill(n: int) -> None:
        llama.prefill([prompt] * n, list(range(n)))
    return prefill


def prefill_passes(prefill: Callable[[int], None], batch: int, sps: StepsPerSecond,
                   clock: Callable[[], float] = time.perf_counter) -> float:
    """What a prefill costs whatever its prompts, in the target's one-token passes of
    ``batch`` rows (``sps``'s first rate): ``prefill(1)`` less what each further prompt adds
    to ``prefill(min(8, batch))`` (medians of five). ``Refills``'s wait for this target."""
    def seconds(n: int) -> float:
        times = []
        for _ in range(5):
            sync()
            start = clock()
            prefill(n)
            sync()
            times.append(clock() - start)
        return sorted(times)[2]
    n, one = min(8, batch), seconds(1)
    fixed = one if n == 1 else max(0.0, one - (seconds(n) - one) / (n - 1))
    return fixed * sps.steps_per_second[0]


def by_width(sps: StepsPerSecond, batch: int) -> StepsPerSecond:
    """``sps`` of ``batch`` rows (one rate per width, by tokens in all) by a row's tokens:
    the rates of the width schedule, for a target that pads every row to the widest."""
    return StepsPerSecond(tuple(t // batch for t in sps.tokens), sps.steps_per_second,
                          by="width")


def fastest_widths(sps: StepsPerSecond, batch: int) -> dict[int, int]:
    """Per verify width of ``batch`` rows, the width at least as wide that ``sps`` (one
    measured rate per width) ran fastest: what ``LlamaTarget``'s ``pad`` takes, and what
    makes :meth:`StepsPerSecond.padded` the target's rates."""
    rates = {tokens // batch: rate for tokens, rate in zip(sps.tokens, sps.steps_per_second)}
    return {n: max((w for w in rates if w >= n), key=lambda w: (rates[w], -w))
            for n in rates}


def fixed_length(length: int, confidences: Tensor) -> Tensor:
    """A schedule that verifies ``length`` drafts of every request."""
    return torch.full(confidences.shape[:1], length, dtype=torch.long)


@contextlib.contextmanager
def overlaps_recorded(rounds: list[tuple[Tensor, Tensor]]) -> Iterator[None]:
    """While open, each row of each of the loop's sampled verifications appends to
    ``rounds`` its ``sum_v min(p_j(v), q_j(v))`` per position (the chance that draft j is
    accepted where it is reached) and the drafts it accepted."""
    verify = loop.verify_rows

    def recording(drafted, q, logits, rows, temperature, *args):
        accepted, tokens = verify(drafted, q, logits, rows, temperature, *args)
        p = acceptance.target_probs(logits, rows, temperature)
        rounds.append((torch.minimum(p[:, :q.shape[1]], q).sum(-1), accepted))
        return accepted, tokens
    loop.verify_rows = recording
    try:
        yield
    finally:
        loop.verify_rows = verify


def sampler_check(rounds: list[tuple[Tensor, Tensor]]) -> dict:
    """Per position, over the rounds that reached it: how often the draft was accepted,
    against the mean of ``sum_v min(p, q)`` there and its standard error (equal within a
    few errors where the sampler is exact), up to the first position no round reached; and
    the tokens a round these chances make."""
    overlap = torch.cat([o.cpu() for o, _ in rounds]).double()
    accepted = torch.cat([a.cpu() for _, a in rounds])
    check = dict(rounds=len(accepted), realized=[], expected=[], standard_error=[])
    for j in range(overlap.shape[1]):
        reached = accepted >= j
        if not reached.any():  # no round got this far: nothing to compare from here on
            break
        expected = overlap[reached, j]
        check["realized"].append(float((accepted[reached] > j).double().mean()))
        check["expected"].append(float(expected.mean()))
        check["standard_error"].append(float((expected * (1 - expected)).sum().sqrt()
                                             / int(reached.sum())))
    for name in ("realized", "expected"):
        check[f"{name}_tokens_per_round"] = 1 + float(
            torch.tensor(check[name]).cumprod(0).sum())
    return check
