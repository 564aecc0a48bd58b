"""Rounds that are the target's own steps (``max_draft_rows``): no draft, one token a request,
the drafter reading what it missed at its next round; the output is still the target's."""

import pytest
import torch

from dspark_compile.checkpoint import random_drafter
from dspark_compile.compile import build_artifact
from dspark_compile.config import lane_config
from dspark_compile.errors import ConfigError
from dspark_compile.runtime import load_runner
from dspark_compile.speculative import Request, decode
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
    result = decode(target, runner, REQUESTS, max_draft_rows=max_draft_rows)
    for request, completion in zip(REQUESTS, result.completions):
        assert completion.tokens == target.greedy(request.prompt, request.max_new_tokens)
    drafted = sum(len(c.accepted) for c in result.completions)
    if max_draft_rows == 0:
        assert rounds == [] and drafted == 0
    else:
        assert rounds and set(rounds) == {1} and 0 < len(rounds) < result.passes
        assert drafted > 0


def test_max_draft_rows_below_zero_is_refused(device, tmp_path):
    lane, runner, _ = counted_runner(device, 2, tmp_path)
    target = BigramTarget(lane.target_vocab_size, lane.feature_size, 2, device)
    with pytest.raises(ConfigError, match="max_draft_rows"):
        decode(target, runner, REQUESTS, max_draft_rows=-1)
