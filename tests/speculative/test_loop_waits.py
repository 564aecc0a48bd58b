"""The loop's host waits for the device once a round, at the draft's download, so the
target's pass is still running while the host issues the next round. A bigram target
(each token's logits and features looked up, nothing synchronised of its own) leaves the
loop's own waits to count, with CUDA's sync debug mode."""

import warnings

import pytest
import torch

from dspark_compile.checkpoint import random_drafter
from dspark_compile.compile import build_artifact
from dspark_compile.config import lane_config
from dspark_compile.runtime import load_runner
from dspark_compile.speculative import MaxDraftRows, Request, decode
from dspark_compile.tools.bigram import BigramTarget


def decoded(device, rows: int, requests: list[Request], directory, temperature: float = 0.0,
            schedule=None, max_draft_rows=None):
    lane = lane_config("tiny")
    drafter = random_drafter(lane, device, seed=0)
    path, _ = build_artifact(drafter, "eager", [rows], directory, with_probs=temperature > 0)
    runner = load_runner(path, device)
    target = BigramTarget(lane.target_vocab_size, lane.feature_size, rows, device)
    return target, runner, lambda: decode(target, runner, requests, temperature, schedule,
                                          max_draft_rows)


REQUESTS = [Request([1, 2, 3], 24), Request([400, 17, 9], 9), Request(list(range(40, 60)), 17),
            Request([5], 1), Request([8, 8], 30)]


def test_greedy_output_is_the_table_targets_walk_with_rows_refilled(device, tmp_path):
    target, _, run = decoded(device, 2, REQUESTS, tmp_path)
    for request, completion in zip(REQUESTS, run().completions):
        assert completion.tokens == target.greedy(request.prompt, request.max_new_tokens)


def no_drafts(confidences):
    return torch.zeros(len(confidences), dtype=torch.long)


def test_the_busy_span_ends_where_the_queue_runs_dry(device, tmp_path):
    # verifying no drafts, each pass gives each request it serves one token, and a done
    # request's row sits out the round in which the loop learns it is done. Rows 0, 1 take
    # requests of 5 and 9 tokens (the first from the prefill): request 0 is done after pass
    # 3, its row idle in pass 4, then refilled with the last request. By the end of pass
    # 4: its 5 tokens and request 1's 1 + 5.
    requests = [Request([1, 2], 5), Request([3], 9), Request([4, 5, 6], 4)]
    _, _, run = decoded(device, 2, requests, tmp_path, schedule=no_drafts)
    result = run()
    assert [len(c.tokens) for c in result.completions] == [5, 9, 4]
    assert result.passes == 8  # request 1's; in row 0, 4 of request 0, 1 idle, 3 of request 2
    assert result.busy_tokens == 11
    assert 0 < result.busy_seconds < result.seconds
    assert 0 < result.prefill_seconds < result.seconds


def test_a_round_of_every_row_needs_no_layout_after_rows_are_refilled(device, tmp_path):
    # refills move the runner's rows (a released slot's row takes the last one): the loop
    # hands it the round in its own row order, so a round of all rows copies straight in
    target, runner, run = decoded(device, 2, REQUESTS, tmp_path)
    rounds, layout = [], runner.layout

    def counted(inputs, slots):
        rounds.append(len(slots))
        return layout(inputs, slots)
    runner.layout = counted
    result = run()
    assert rounds and all(count < 2 for count in rounds)
    assert result.passes > len(rounds)  # the rounds of both rows took no layout
    for request, completion in zip(REQUESTS, result.completions):
        assert completion.tokens == target.greedy(request.prompt, request.max_new_tokens)


def test_no_busy_span_where_every_request_has_a_row_from_the_start(device, tmp_path):
    _, _, run = decoded(device, 2, REQUESTS[:2], tmp_path)
    result = run()
    assert (result.busy_tokens, result.busy_seconds) == (0, 0.0)


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="waits for the device exist only on a GPU (DSPARK_TEST_DEVICE=cuda)")
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("max_draft_rows", [None, 0], ids=["drafts", "own steps"])
def test_a_round_waits_for_the_device_once(tmp_path, monkeypatch, temperature,
                                           max_draft_rows):
    device = torch.device("cuda")
    target, runner, run = decoded(device, 2, REQUESTS, tmp_path, temperature,
                                  max_draft_rows=max_draft_rows)
    rounds = []
    draft = runner.draft

    def counted(inputs, slots):
        rounds.append(inputs)
        return draft(inputs, slots)
    monkeypatch.setattr(runner, "draft", counted)
    run()  # once untimed: lazy initialisation may wait
    rounds.clear()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = run()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    waits = [w for w in caught if "synchronizing" in str(w.message)]
    # the download of each round (prompt rounds too), or the wait of each of the target's
    # own steps, and the end of the run
    assert len(waits) <= len(rounds) + (max_draft_rows is not None) * result.passes + 1, \
        [str(w.message) for w in waits][:5]
    for request, completion in zip(REQUESTS, result.completions):
        assert len(completion.tokens) == request.max_new_tokens
        if not temperature:
            assert completion.tokens == target.greedy(request.prompt, request.max_new_tokens)


def test_the_handoff_is_timed_between_each_draft_and_its_pass(device, tmp_path):
    # the drafted rounds' handoffs lie outside their drafts and passes; a run of the
    # target's own steps has none
    _, _, run = decoded(device, 2, REQUESTS, tmp_path)
    result = run()
    outside = result.seconds - result.draft_seconds - result.verify_seconds \
        - result.prefill_seconds
    assert 0 < result.handoff_seconds < outside
    _, _, own = decoded(device, 2, REQUESTS, tmp_path, max_draft_rows=MaxDraftRows(0))
    assert own().handoff_seconds == 0.0


def test_rows_refilled_together_give_the_same_output_in_fewer_prefills(device, tmp_path):
    # five requests through two rows: at once, a prefill for each request after the first
    # two; waiting 3 passes of both rows, two of those three share one
    requests = [Request([1, 2, 3], 12), Request([400, 17], 13), Request([9] * 5, 4),
                Request([5], 6), Request([8, 8], 7)]
    counts = {}
    for wait in (0.0, 3.0):
        target, runner, _ = decoded(device, 2, requests, tmp_path / str(wait))
        calls, prefill = [], target.prefill

        def counted(rows, prompts):
            calls.append(len(rows))
            return prefill(rows, prompts)
        target.prefill = counted
        result = decode(target, runner, requests, refill_wait=wait)
        for request, completion in zip(requests, result.completions):
            assert completion.tokens == target.greedy(request.prompt, request.max_new_tokens)
        counts[wait] = calls
    assert sum(counts[0.0]) == sum(counts[3.0]) == len(requests)
    assert len(counts[3.0]) < len(counts[0.0])
