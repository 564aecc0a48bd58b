"""Confidence scheduling against brute force and outside references: Algorithm 1 against
every verify-length vector of small cases, SPS's interpolation against numpy's, STS
against outcomes drawn from known survival chances."""

import itertools

import numpy as np
import pytest
import torch

from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import lane_config
from dspark_compile.draft import KVCache, RoundInputs, draft
from dspark_compile.errors import ConfigError
from dspark_compile.runtime import load_runner, schedule
from dspark_compile.tools.rounds import synthetic_rounds
from dspark_compile.tools.timing import launches
from dspark_compile.runtime.schedule import (StepsPerSecond, fit_position_temperatures,
                                             survival_errors, verify_lengths, verify_width)


def value(confidences: torch.Tensor, lengths, sps: StepsPerSecond) -> float:
    """tau * SPS(B) of verify lengths, recomputed row by row."""
    tau = sum(1 + sum(float(np.prod(row[:j + 1])) for j in range(l))
              for row, l in zip(confidences.double().tolist(), lengths))
    tokens = sum(1 + l for l in lengths)
    return tau * float(sps(torch.tensor([tokens]))[0])


def affine_sps(requests: int, k: int) -> StepsPerSecond:
    """A step that costs a fixed time plus a time per token: rates 1 / (c0 + c1 B)."""
    tokens = tuple(range(1, requests * (k + 1) + 1))
    return StepsPerSecond(tokens, tuple(1.0 / (3.0 + 0.7 * b) for b in tokens))


@pytest.mark.parametrize("requests,k,seed", [(1, 4, 0), (2, 3, 1), (3, 2, 2), (3, 4, 3),
                                             (2, 4, 4)])
def test_algorithm_1_finds_the_best_lengths_where_the_step_time_is_affine(
        requests, k, seed, device):
    confidences = torch.rand(requests, k, generator=torch.Generator().manual_seed(seed))
    sps = affine_sps(requests, k)
    lengths = verify_lengths(confidences.to(device), sps).cpu().tolist()
    best = max(itertools.product(range(k + 1), repeat=requests),
               key=lambda ls: value(confidences, ls, sps))
    assert value(confidences, lengths, sps) == pytest.approx(value(confidences, best, sps),
                                                             rel=1e-12)


def test_algorithm_1_stops_at_the_first_step_that_does_not_pay_even_where_a_later_one_would():
    """A measured SPS that dips at B = 2 (say, a kernel's worse tile at two rows): the early
    stop verifies nothing, the anchor alone (100 expected tokens a second), where verifying
    all three drafts gives 3.439 x 60 = 206: it loses 51%, the price of the early stop that
    keeps the schedule lossless."""
    confidences = torch.full((1, 3), 0.9)
    sps = StepsPerSecond((1, 2, 3, 4), (100.0, 40.0, 60.0, 60.0))
    assert verify_lengths(confidences, sps).tolist() == [0]
    best = max(range(4), key=lambda l: value(confidences, [l], sps))
    assert best == 3 and value(confidences, [3], sps) == pytest.approx(206.34)


def test_a_padded_table_lets_algorithm_1_past_the_dip():
    """The same dip, for a target that runs two tokens as its faster three-token step: each
    rate is the best at that many tokens or more, and Algorithm 1 finds the brute force's
    best lengths again."""
    sps = StepsPerSecond((1, 2, 3, 4), (100.0, 40.0, 60.0, 40.0)).padded()
    assert sps.steps_per_second == (100.0, 60.0, 60.0, 40.0)
    confidences = torch.full((1, 3), 0.9)
    best = max(range(4), key=lambda l: value(confidences, [l], sps))
    assert verify_lengths(confidences, sps).tolist() == [best] == [2]


@pytest.mark.parametrize("seed", range(4))
def test_algorithm_1_over_a_rounds_rates_maximises_tokens_per_second_of_the_round(seed):
    """With a fixed time per round outside the target's pass (the draft), the best lengths
    maximise expected tokens / (pass time + that time), found here by brute force over
    every length vector; the pass alone would verify fewer."""
    requests, k, overhead = 2, 3, 1.5
    generator = torch.Generator().manual_seed(seed)
    confidences = torch.rand(requests, k, generator=generator) * 0.5 + 0.3
    tokens = tuple(range(1, requests * (k + 1) + 1))
    pass_seconds = {b: 3.0 + 0.7 * b for b in tokens}
    sps = StepsPerSecond(tokens, tuple(1 / pass_seconds[b] for b in tokens))

    def per_second(lengths) -> float:
        tau = sum(1 + sum(float(np.prod(row[:j + 1])) for j in range(l))
                  for row, l in zip(confidences.double().tolist(), lengths))
        return tau / (pass_seconds[sum(1 + l for l in lengths)] + overhead)
    best = max(itertools.product(range(k + 1), repeat=requests), key=per_second)
    lengths = verify_lengths(confidences, sps.with_overhead(overhead)).tolist()
    assert per_second(lengths) == pytest.approx(per_second(best), rel=1e-12)
    assert sum(verify_lengths(confidences, sps).tolist()) <= sum(lengths)


def padded_value(confidences: torch.Tensor, lengths, sps: StepsPerSecond) -> float:
    """tau * SPS(width) of verify lengths for a target that pads every row to the widest."""
    tau = sum(1 + sum(float(np.prod(row[:j + 1])) for j in range(l))
              for row, l in zip(confidences.double().tolist(), lengths))
    return tau * float(sps(torch.tensor([max(lengths) + 1]))[0])


@pytest.mark.parametrize("requests,k,seed", [(1, 4, 0), (2, 3, 1), (3, 3, 2), (4, 2, 3)])
def test_the_width_schedule_finds_the_best_lengths_for_a_padded_target(
        requests, k, seed, device):
    """Against every length vector, where a pass costs by its widest row: a rate by width
    that dips and recovers (no early stop can be right here), and the brute force's value
    reached; among equal values the fewest drafts."""
    generator = torch.Generator().manual_seed(seed)
    confidences = torch.rand(requests, k, generator=generator) * 0.6 + 0.35
    widths = tuple(range(1, k + 2))
    sps = StepsPerSecond(widths, tuple(float(r) for r in
                                       torch.rand(k + 1, generator=generator) * 50 + 50),
                         by="width")
    lengths = verify_width(confidences.to(device), sps).cpu().tolist()
    best = max(padded_value(confidences, ls, sps)
               for ls in itertools.product(range(k + 1), repeat=requests))
    assert padded_value(confidences, lengths, sps) == pytest.approx(best, rel=1e-12)
    assert len(set(lengths)) == 1 and sps.lengths(confidences).tolist() == lengths
    flat = StepsPerSecond(widths, (60.0,) * (k + 1), by="width")  # every width costs alike
    assert verify_width(torch.zeros(requests, k), flat).tolist() == [0] * requests


def test_the_width_schedule_counts_only_the_live_rows():
    """Two rows out: their confidences (high) must not buy a width the live row's (low) do
    not pay for; the rows out verify nothing."""
    confidences = torch.tensor([[0.1, 0.1], [0.99, 0.99], [0.99, 0.99]])
    live = torch.tensor([True, False, False])
    sps = StepsPerSecond((1, 2, 3), (100.0, 80.0, 70.0), by="width")
    assert verify_width(confidences, sps, live).tolist() == [0, 0, 0]
    assert verify_width(confidences, sps).tolist() == [2, 2, 2]  # all live: worth it
    with pytest.raises(ValueError, match="by="):
        StepsPerSecond((1,), (1.0,), by="rows")


def test_steps_per_second_interpolates_as_numpy_does():
    sps = StepsPerSecond((1, 4, 16, 64), (900.0, 850.0, 600.0, 200.0))
    tokens = torch.tensor([0, 1, 2, 3, 4, 10, 16, 40, 64, 100])
    expected = np.interp(tokens.numpy(), sps.tokens, sps.steps_per_second)
    assert sps(tokens).numpy() == pytest.approx(expected)
    with pytest.raises(ValueError, match="ascend"):
        StepsPerSecond((4, 1), (1.0, 2.0))


def test_the_profiler_takes_each_steps_median_time(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(schedule.time, "perf_counter", lambda: clock[0])
    calls = []

    def verify_step(tokens):  # 2 ms plus 0.5 ms a token, one call in five 10 ms slower
        calls.append(tokens)
        clock[0] += 0.002 + 0.0005 * tokens + (0.01 if len(calls) % 5 == 0 else 0)
    sps = schedule.profile_steps_per_second(verify_step, [1, 8], repeats=9, warmup=1)
    assert sps.tokens == (1, 8) and calls == [1] * 10 + [8] * 10
    assert sps.steps_per_second == pytest.approx((1 / 0.0025, 1 / 0.006))


def overstated_rounds(rounds: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rounds whose drafts survive, position by position, with chances the confidences
    overstate (the true logit is the confidence's over 2.5 at the first position, over 1.5
    after): their confidences ``[rounds, 4]`` and drafts accepted ``[rounds]``."""
    generator = torch.Generator().manual_seed(seed)
    confidences = torch.rand(rounds, 4, generator=generator) * 0.9 + 0.05
    chance = torch.sigmoid(torch.logit(confidences) / torch.tensor([2.5, 1.5, 1.5, 1.5]))
    survives = torch.rand(rounds, 4, generator=generator) < chance
    return confidences, survives.long().cumprod(-1).sum(-1)  # accepted before the first miss


@pytest.mark.parametrize("criterion", ["log_loss", "calibration_error"])
def test_position_temperatures_lower_the_calibration_error_on_held_out_rounds(criterion):
    """STS fitted on half the rounds lowers the survival's calibration error on the other
    half at every position, and finds the first position's temperature."""
    confidences, accepted = overstated_rounds(8000, 0)
    fit, held = slice(0, 4000), slice(4000, 8000)
    sts = fit_position_temperatures(confidences[fit], accepted[fit], criterion=criterion)
    before = survival_errors(confidences[held], accepted[held])
    after = survival_errors(sts(confidences[held]), accepted[held])
    assert all(a < b for a, b in zip(after, before)), (before, after)
    assert sts.temperatures[0] == pytest.approx(2.5, rel=0.25)


@pytest.mark.parametrize("seed", range(5))
def test_position_temperatures_fitted_by_log_loss_on_few_rounds_still_lower_the_error(seed):
    """From 400 rounds (as a short recording run gives) the log-loss fit lowers the
    calibration error of 20,000 other rounds at every position (the binned calibration
    error as the criterion fits its bins' noise there: temperatures at the grid's end)."""
    confidences, accepted = overstated_rounds(400, 100 + seed)
    held_confidences, held_accepted = overstated_rounds(20000, 1)
    sts = fit_position_temperatures(confidences, accepted)
    before = survival_errors(held_confidences, held_accepted)
    after = survival_errors(sts(held_confidences), held_accepted)
    assert all(a < b for a, b in zip(after, before)), (before, after)


def rounds_of_three_rows(runner, rounds):
    """Each round's output, its rows alternately all three in order and two laid out."""
    slots = [runner.admit() for _ in range(3)]
    for index, inputs in enumerate(rounds):
        chosen = [0, 1, 2] if index % 2 else [2, 0]
        picked = RoundInputs(*(t[chosen] for t in inputs.tensors()))
        yield runner.draft(picked, [slots[i] for i in chosen]), picked, [slots[i] for i in chosen]


def steps_per_second(by: str, per_token: float, k: int) -> StepsPerSecond:
    """A step that costs a fixed time plus one per token: by tokens, B of three rows; by
    width, three rows each as wide as the widest."""
    if by == "width":
        widths = tuple(range(1, k + 2))
        return StepsPerSecond(widths, tuple(1.0 / (3.0 + 3 * per_token * w) for w in widths),
                              by="width")
    tokens = tuple(range(1, 3 * (k + 1) + 1))
    return StepsPerSecond(tokens, tuple(1.0 / (3.0 + per_token * b) for b in tokens))


@pytest.mark.parametrize("by", ["tokens", "width"])
def test_a_scheduled_runner_returns_its_schedules_lengths_over_its_rounds_rows(
        built_artifact, device, by):
    """The lengths a scheduled round returns are Algorithm 1's (by tokens) or the width
    schedule's over the confidences of the requests in the round only (the bucket's other
    rows neither counted nor verified), with its rows laid out or in order; one graph
    replay and one download still."""
    path = built_artifact("eager", "tiny")
    k = lane_config("tiny").k
    rounds = list(synthetic_rounds(lane_config("tiny"), 3, 20, 6, 4, device))
    plain = [out.confidences for out, *_ in rounds_of_three_rows(load_runner(path, device),
                                                                  rounds)]
    # a cost per token under which these confidences get lengths that differ (a wrong count
    # of requests would then show), whatever the device's rounding made of them
    varied = [c for c in (0.1, 0.3, 0.7, 1.5, 3.0, 8.0) if len(set(
        torch.cat([steps_per_second(by, c, k).lengths(x) for x in plain]).tolist())) > 1]
    assert varied, "no cost per token gives lengths that differ"
    sps = steps_per_second(by, varied[0], k)
    runner = load_runner(path, device)
    runner.schedule(sps)
    for (out, picked, slots), confidences in zip(rounds_of_three_rows(runner, rounds), plain):
        assert torch.equal(out.confidences, confidences)
        assert torch.equal(out.lengths, sps.lengths(confidences))
    if device.type == "cuda":
        graphs, _ = launches(lambda: runner.draft(picked, slots), device)
        assert graphs == 1
    runner.schedule(None)
    assert runner.draft(picked, slots).lengths is None


def lagged_lengths(sps: StepsPerSecond, rounds, lag: int, k: int) -> list[torch.Tensor]:
    """Each round's lengths recomputed from every slot's full record: the schedule over the
    confidences each slot drafted ``lag`` of its rounds before, every draft where it has
    none that old (its confidences then count as ones)."""
    drafted: dict[int, list[torch.Tensor]] = {}
    out = []
    for confidences, slots in rounds:
        old = [drafted[s][-lag] if len(drafted.get(s, [])) >= lag else torch.ones(k)
               for s in slots]
        fresh = torch.tensor([len(drafted.get(s, [])) < lag for s in slots])
        out.append(sps.lengths(torch.stack(old)).masked_fill(fresh, k))
        for slot, c in zip(slots, confidences):
            drafted.setdefault(slot, []).append(c)
    return out


@pytest.mark.parametrize("by", ["tokens", "width"])
def test_a_lagged_runner_schedules_each_request_by_its_own_rounds_before(built_artifact, device,
                                                                          by):
    """DSpark's production variant: a request's lengths come from the confidences its slot
    drafted two of its rounds before. Slot 1 drafts in every other round only, so its
    rounds are not the runner's."""
    path = built_artifact("eager", "tiny")
    k = lane_config("tiny").k
    rounds = list(synthetic_rounds(lane_config("tiny"), 3, 20, 8, 4, device))
    plain = [(out.confidences, slots)
             for out, _, slots in rounds_of_three_rows(load_runner(path, device), rounds)]
    costs = [c for c in (0.1, 0.3, 0.7, 1.5, 3.0, 8.0) if len(set(torch.cat(
        lagged_lengths(steps_per_second(by, c, k), plain, 2, k)).tolist()) - {k}) > 1]
    assert costs, "no cost per token gives lengths that differ"
    sps = steps_per_second(by, costs[0], k)
    runner = load_runner(path, device)
    runner.schedule(sps, lag=2)
    expected = lagged_lengths(sps, plain, 2, k)
    for (out, *_), lengths in zip(rounds_of_three_rows(runner, rounds), expected):
        assert torch.equal(out.lengths, lengths)
    with pytest.raises(ConfigError, match="lag=-1"):
        runner.schedule(sps, lag=-1)


def test_position_temperatures_apply_in_the_built_step_and_key_the_artifact(
        built_artifact, device):
    """An artifact of a lane with STS returns each confidence's logit over its position's
    temperature (recomputed here from the same drafter's own confidences), and is another
    artifact than the lane's without."""
    temperatures = [2.0, 0.5, 1.0, 3.0, 0.25]
    plain = load_runner(built_artifact("eager", "tiny"), device)
    scaled_path = built_artifact("eager", "tiny", confidence_temperatures=temperatures)
    scaled = load_runner(scaled_path, device)
    assert scaled_path != built_artifact("eager", "tiny")
    assert scaled.lane.confidence_temperatures == temperatures
    slots = [plain.admit(), plain.admit()], [scaled.admit(), scaled.admit()]
    for inputs in synthetic_rounds(plain.lane, 2, 20, 3, 5, device):
        a, b = plain.draft(inputs, slots[0]), scaled.draft(inputs, slots[1])
        assert torch.equal(a.ids, b.ids)
        expected = torch.sigmoid(torch.logit(a.confidences.double())
                                 / torch.tensor(temperatures, dtype=torch.float64))
        assert torch.allclose(b.confidences.double(), expected, rtol=1e-5, atol=1e-6)
        assert not torch.allclose(a.confidences, b.confidences)


def test_a_drafter_calibrated_in_place_drafts_with_the_temperatures_and_says_so(device):
    drafter = random_drafter(lane_config("tiny"), device, seed=3)
    cache = KVCache.allocate(drafter.lane, 2, device, 64)
    inputs = next(synthetic_rounds(drafter.lane, 2, 20, 1, 0, device))
    before = draft(drafter, cache.clone(), inputs).confidences
    drafter.calibrate([4.0] * drafter.lane.k)
    after = draft(drafter, cache.clone(), inputs).confidences
    assert drafter.lane.confidence_temperatures == [4.0] * drafter.lane.k
    assert torch.allclose(after.double(), torch.sigmoid(torch.logit(before.double()) / 4),
                          rtol=1e-5, atol=1e-6)
    with pytest.raises(ConfigError, match="confidence_temperatures"):
        drafter.calibrate([1.0])  # one per draft position
