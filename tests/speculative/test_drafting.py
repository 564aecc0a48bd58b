"""Rounds that are the target's own steps (``speculative.drafting``'s policies): no draft, one
token a request, the drafter reading what it missed at its next round; the output is still
the target's. And when ``WhileDraftingPays`` drafts, by its arithmetic done by hand."""

import pytest
import torch

from dspark_compile.checkpoint import random_drafter
from dspark_compile.compile import build_artifact
from dspark_compile.config import lane_config
from dspark_compile.errors import ConfigError
from dspark_compile.runtime import load_runner
from dspark_compile.runtime.schedule import StepsPerSecond
from dspark_compile.speculative import MaxDraftRows, Request, WhileDraftingPays, decode
from dspark_compile.tools.bigram import BigramTarget


def counted_runner(device, rows: int, directory):
    """A runner of the tiny lane's random drafter, and the slots of each round it drafts."""
    lane = lane_config("tiny")
    path, _ = build_artifact(random_drafter(lane, device, seed=0), "eager", [rows], directory)
    runner, rounds = load_runner(path, device), []
    draft = runner.draft

    def counted(inputs, slots):
        rounds.append(len(slots))
        return draft(inputs, slots)
    runner.draft = counted
    return lane, runner, rounds


REQUESTS = [Request([1, 2, 3], 24), Request([400, 17, 9], 9), Request(list(range(40, 60)), 17),
            Request([5], 1), Request([8, 8], 30)]


@pytest.mark.parametrize("max_draft_rows", [0, 1])
def test_greedy_output_is_the_targets_with_rounds_of_its_own_steps(device, tmp_path,
                                                                    max_draft_rows):
    # two rows: at 0 no round drafts; at 1 the rounds of both rows are the target's own
    # steps and the rounds of one row draft, the drafter then reading what it missed (a
    # refilled row: its prompt and the steps after it)
    lane, runner, rounds = counted_runner(device, 2, tmp_path)
    target = BigramTarget(lane.target_vocab_size, lane.feature_size, 2, device)
    result = decode(target, runner, REQUESTS, drafting=MaxDraftRows(max_draft_rows))
    for request, completion in zip(REQUESTS, result.completions):
        assert completion.tokens == target.greedy(request.prompt, request.max_new_tokens)
    drafted = sum(len(c.accepted) for c in result.completions)
    if max_draft_rows == 0:
        assert rounds == [] and drafted == 0
    else:
        assert rounds and set(rounds) == {1} and 0 < len(rounds) < result.passes
        assert drafted > 0


def test_policies_refuse_what_they_cannot_mean():
    with pytest.raises(ConfigError, match="MaxDraftRows"):
        MaxDraftRows(-1)
    with pytest.raises(ConfigError, match="by width"):
        WhileDraftingPays(StepsPerSecond((1, 2), (100.0, 80.0)), 100.0)
    with pytest.raises(ConfigError, match="explore"):
        WhileDraftingPays(WIDTHS, 100.0, explore=0)


# a round of 2 tokens a row runs 80 times a second, of 6 tokens 50 (with its draft)
WIDTHS = StepsPerSecond((1, 2, 6), (100.0, 80.0, 50.0), by="width")


def test_drafting_pays_where_tokens_times_the_round_rate_reach_the_own_steps_rate():
    policy = WhileDraftingPays(WIDTHS, own=100.0, explore=4, weight=0.5)
    assert policy.drafts(8)  # nothing seen yet
    policy.observe(1.0, 2)  # 1.0 x 80 < 100: declines 3 rounds, drafts the 4th
    assert [policy.drafts(8) for _ in range(8)] == [False, False, False, True] * 2
    policy.observe(2.0, 2)  # 8 passes on, weighs 1 - 0.5^8: 1.996 x 80 = 159.7
    assert all(policy.drafts(8) for _ in range(5))
    policy.observe(3.0, 2)  # 5 passes on: 2.969 x 80
    assert policy.drafts(8)
    policy.observe(1.0, 6)  # 1 pass on, weighs 0.5: 1.984 x 65 = 129.0 (the rate averaged too)
    assert policy.drafts(8)
    policy.observe(0.5, 6)  # 1.242 x 57.5 = 71.4
    assert not policy.drafts(8)


def test_an_exploring_round_weighs_the_own_steps_before_it():
    # declined for 15 passes, one good exploring round restarts the drafts at once; over
    # drafted rounds (weight 0.05 once) it would not: 1.05 x 80 < 100
    policy = WhileDraftingPays(WIDTHS, own=100.0, explore=16, weight=0.05)
    policy.drafts(1)
    policy.observe(1.0, 2)
    assert [policy.drafts(1) for _ in range(16)] == [False] * 15 + [True]
    policy.observe(2.0, 2)  # weighs 1 - 0.95^16 = 0.56: 1.56 x 80 = 124.8
    assert policy.drafts(1)


@pytest.mark.parametrize("own", [1e-6, 1e6])
def test_a_drafter_that_never_pays_drafts_one_round_in_explore(device, tmp_path, own):
    # the random drafter on the bigram walk makes about one token a round: at 50 rounds a
    # second it pays against own steps of 1e-6 a second, not against 1e6
    lane, runner, rounds = counted_runner(device, 1, tmp_path)
    target = BigramTarget(lane.target_vocab_size, lane.feature_size, 1, device)
    requests = [Request([1, 2, 3], 40), Request([7], 25)]
    result = decode(target, runner, requests,
                    drafting=WhileDraftingPays(WIDTHS, own, explore=8))
    for request, completion in zip(requests, result.completions):
        assert completion.tokens == target.greedy(request.prompt, request.max_new_tokens)
    if own < 1:  # every pass verified a draft (a last round may draft for rows that ended)
        assert len(rounds) >= result.passes
    else:  # two rounds before the first outcome is seen, then one in 8
        assert 2 <= len(rounds) <= 2 + result.passes // 8 + 1 < result.passes / 2


class Pattern:
    """A policy that drafts by a fixed cycle of rounds, whatever it observes."""

    def __init__(self, cycle: list[bool]):
        self.cycle, self.round = cycle, 0

    def drafts(self, live: int) -> bool:
        self.round += 1
        return self.cycle[(self.round - 1) % len(self.cycle)]

    def observe(self, tokens: float, width: int) -> None:
        pass


def test_after_own_steps_a_round_hands_the_drafter_every_position_it_missed(device, tmp_path):
    # each drafted round's context, against the bigram table's features of the request's
    # tokens: its rows are the positions right after the last round's, up to its anchor
    lane, runner, _ = counted_runner(device, 1, tmp_path)
    target = BigramTarget(lane.target_vocab_size, lane.feature_size, 1, device)
    seen, draft = [], runner.draft

    def recorded(inputs, slots):
        seen.append((inputs.features.cpu(), int(inputs.num_new), int(inputs.anchor),
                     int(inputs.anchor_pos)))
        return draft(inputs, slots)
    runner.draft = recorded
    requests = [Request([1, 2, 3], 30), Request([7, 9], 26)]
    result = decode(target, runner, requests, drafting=Pattern([True, False, False, True,
                                                                 True, False]))
    sequences = [r.prompt + c.tokens for r, c in zip(requests, result.completions)]
    request, covered = -1, 0
    for features, num_new, anchor, position in seen:
        if position - num_new == 0:  # a request's first round: its prompt
            request, covered = request + 1, 0
        sequence = sequences[request]
        assert position - num_new == covered and sequence[position] == anchor
        expected = target.features[torch.tensor(sequence[covered:position], device=device)]
        torch.testing.assert_close(features[0, :num_new], expected.cpu().to(features.dtype))
        covered = position
    assert request == 1 and len(seen) < result.passes
