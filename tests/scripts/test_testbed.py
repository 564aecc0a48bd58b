"""The testbed's code path on the CPU at a tiny scale, without the GGUF: a random Llama
from transformers as the target, its own greedy answers as data (checked against
transformers' generate), a few training steps, the speculators checkpoint read back,
draft -> verify through the runtime, and the teacher-forced blocks that training and
evaluation use against the rounds the runtime drafted."""

import argparse
import functools
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the dev extra has transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "testbed"))
from alone import baseline, cache_slots, target_alone  # noqa: E402
from blocks import context, target_pass, teacher_forced  # noqa: E402
from certificate import reads, report  # noqa: E402
from data import generate  # noqa: E402
from e2e import measure, report as e2e_report, speculative  # noqa: E402
from evaluate import held_out_blocks, statistics, validate  # noqa: E402
from llama import LlamaTarget  # noqa: E402
from scheduling import (by_width, calibration, fastest_widths, fixed_length,  # noqa: E402
                        overlaps_recorded, prefill_of, prefill_passes,
                        sampler_check, steps_per_second)
from train import train  # noqa: E402

from dspark_compile import lane_config, load_checkpoint, load_runner, save_checkpoint  # noqa: E402
from dspark_compile.checkpoint import random_drafter  # noqa: E402
from dspark_compile.compile import build_artifact  # noqa: E402
from dspark_compile.runtime.schedule import StepsPerSecond  # noqa: E402
from dspark_compile.speculative import MaxDraftRows, Request, decode, loop  # noqa: E402

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        tie_word_embeddings=True)).eval()


def test_greedy_answers_are_transformers_greedy_generation(target):
    prompts = [torch.randint(0, 64, (n,)).tolist() for n in (3, 6, 4, 5, 3)]
    answers = generate(target, prompts, "greedy", 12, batch=2, eos=-1, seed=0)
    for prompt, answer in zip(prompts, answers):
        expected = target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=12,
                                   pad_token_id=0)[0, len(prompt):]
        assert answer == expected.tolist()


def test_a_trained_drafter_loads_and_decodes_losslessly(target, tmp_path):
    target.save_pretrained(tmp_path / "target")
    lane = lane_config("tiny", hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8,
                       intermediate_size=64, target_vocab_size=64, draft_vocab_size=64,
                       mask_token_id=63, target_layer_ids=[0, 2], k=3, markov_rank=16,
                       max_context=256, max_batch=2)
    torch.manual_seed(1)
    prompts = torch.randint(0, 63, (24, 4)).tolist()
    # greedy: a random target's samples are near uniform, unlearnable; its greedy answers
    # repeat a token of their own, so the validation answers are training ones
    sequences = [torch.tensor(p + a) for p, a in
                 zip(prompts, generate(target, prompts, "greedy", 48, 8, -1, 0))]
    validation = (sequences[:2], [4, 4])
    drafter, history, curve = train(target, lane, sequences, [4] * 24, steps=60,
                                    batch=8, length=52, anchors=4, lr=1e-2, seed=0,
                                    device=CPU, validation=validation, validate_every=30)
    assert sum(history[-5:]) < sum(history[:5]) - 0.5  # the block cross-entropy falls
    assert [point["step"] for point in curve] == [0, 30, 60]
    assert curve[-1]["tokens_per_round"] > curve[0]["tokens_per_round"]
    save_checkpoint(drafter, tmp_path / "drafter", "speculators", verifier=tmp_path / "target")
    loaded = load_checkpoint(tmp_path / "drafter", lane, "cpu", verifier=tmp_path / "target")
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    runner = load_runner(build_artifact(loaded, "eager", [2], tmp_path / "artifacts")[0])
    requests = prompts[:2]
    slots = cache_slots(requests, 24, lane.k)
    wanted = [24, 17]  # tokens per request: a batch runs until its longest is done
    alone, _, _ = target_alone(target, requests, wanted, 0.0, False, lane.target_layer_ids,
                               slots, CPU)
    run = speculative(target, runner, requests, wanted, 0.0, False, slots, CPU)
    assert list(map(len, alone)) == wanted
    assert run["tokens"] == alone
    # through one row of the target: the second request prefilled into it once the first ends
    one_row = decode(LlamaTarget(target, 1, slots, lane.target_layer_ids, lane.k + 1, False),
                     runner, [Request(r, n) for r, n in zip(requests, wanted)])
    assert [c.tokens for c in one_row.completions] == alone
    # the margins an untimed run reports where outputs part: transformers' own top-2 gaps
    same_tokens, margins, _ = target_alone(target, requests, wanted, 0.0, False,
                                           lane.target_layer_ids, slots, CPU, margins=True)
    assert same_tokens == alone
    with torch.no_grad():
        logits = target(torch.tensor([requests[0] + alone[0]])).logits[0]
    best = logits[len(requests[0]) - 1:-1].topk(2).values
    assert margins[0] == pytest.approx((best[:, 0] - best[:, 1]).tolist(), abs=1e-4)
    assert sum(run["accepted"]) > 0  # the trained drafter's tokens were accepted
    # e2e's arms: the target alone once, then the loop every draft, with STS fitted on its
    # rounds, Algorithm 1 in the runner's graph, the runner's lagged schedule, a fixed length
    taps = lane.target_layer_ids
    baseline_run = baseline(target, requests, wanted, 2, 0.0, False, taps, slots, CPU)
    assert baseline_run[0] == alone
    measured = measure(target, runner, requests, wanted, 2, 0.0, False, CPU, baseline_run)
    assert measured["same"] == measured["compared"] == 2
    _, fitted = calibration(measured)
    assert len(fitted["sts"]) == lane.k == len(fitted["calibration_error_sts"]) \
        == len(fitted["calibration_error_sts_binned"])
    sps = steps_per_second(target, 2, False, lane.k, taps, slots, CPU)
    assert sps.tokens == (2, 4, 6, 8)
    # each width run as a wider one: still the target's output, one pass a round
    padded = measure(target, runner, requests, wanted, 2, 0.0, False, CPU, baseline_run,
                     pad={1: 4, 2: 4, 3: 4, 4: 4})
    assert padded["same"] == 2 and padded["passes"] == measured["passes"] > 0
    runner.schedule(sps)
    scheduled = measure(target, runner, requests, wanted, 2, 0.0, False, CPU, baseline_run)
    runner.schedule(None)
    assert scheduled["same"] == scheduled["compared"] == 2  # still the target's output
    runner.schedule(sps, lag=2)
    lagged = measure(target, runner, requests, wanted, 2, 0.0, False, CPU, baseline_run)
    runner.schedule(None)
    assert lagged["same"] == 2 and lagged["verified"][:2] == [lane.k] * 2  # no history yet
    one_draft = measure(target, runner, requests, wanted, 2, 0.0, False, CPU, baseline_run,
                        functools.partial(fixed_length, 1))
    assert set(one_draft["verified"]) == {1} and one_draft["same"] == 2
    # rounds of both rows the target's own one-token steps; once a request is done, the
    # other's drafter reads its prompt and the steps it missed, and drafts
    own = measure(target, runner, requests, wanted, 2, 0.0, False, CPU, baseline_run,
                  drafting=MaxDraftRows(1))
    assert own["same"] == 2 and len(own["verified"]) < own["passes"]
    # both arms through one row, the second request taking it when the first ends
    refilled = baseline(target, requests, wanted, 1, 0.0, False, taps, slots, CPU, True)
    assert refilled[0] == alone
    through_one = measure(target, runner, requests, wanted, 1, 0.0, False, CPU, refilled,
                          refill=True)
    assert through_one["same"] == through_one["compared"] == 2
    # the queue ran dry when the first request ended: until then the one row served it
    assert refilled[2][0] == through_one["busy_tokens"] == wanted[0]
    assert 0 < refilled[2][1] < refilled[1] and 0 < through_one["busy_s"] < through_one["spec_s"]
    args = argparse.Namespace(refill=True, blas="cublaslt", new_tokens=24, to_end_of_answer=True)
    row = e2e_report(through_one, args, "eager", 1, 0.0, False, lane.k, "every draft")
    busy_rates = (refilled[2][0] / refilled[2][1], wanted[0] / through_one["busy_s"])
    assert row["busy_speedup"] == pytest.approx(busy_rates[1] / busy_rates[0])
    assert 0 < refilled[3] < refilled[1]  # its two prompts' prefills, within its run
    # a prefill costs this target some passes; rows waiting on a refill change no token
    assert prefill_passes(prefill_of(target, 2, taps, slots, requests[0]), 2, sps) >= 0
    assert baseline(target, requests * 2, wanted * 2, 2, 0.0, False, taps, slots, CPU, True,
                    50.0)[0] == alone * 2
    assert row["target_alone_prefill_share"] == pytest.approx(refilled[3] / refilled[1])
    # the handoffs lie between each draft and its pass: outside both
    assert 0 < through_one["handoff_s"] < through_one["spec_s"] - through_one["draft_s"] \
        - through_one["verify_s"] - through_one["prefill_s"]
    assert row["handoff_share"] == pytest.approx(through_one["handoff_s"] / through_one["spec_s"])
    # no round drafted: the target's own steps, reported without rounds
    never = measure(target, runner, requests, wanted, 2, 0.0, False, CPU, baseline_run,
                    drafting=MaxDraftRows(0))
    assert never["same"] == 2 and not never["accepted"]
    assert e2e_report(never, args, "eager", 2, 0.0, False, lane.k, "own steps")["rounds"] == 0

    # each request's rounds, teacher-forced on its greedy answer, accept what the runtime's
    # rounds accepted
    for request, answer in zip(requests, alone):
        one = speculative(target, runner, [request], [len(answer)], 0.0, False, slots, CPU)
        sequence = torch.tensor([request + answer])
        anchors = [len(request)]
        for accepted in one["accepted"][:-1]:
            anchors.append(anchors[-1] + accepted + 1)
        anchors = [s for s in anchors if s + lane.k < sequence.shape[1]]
        features, logits = target_pass(target, sequence, lane.target_layer_ids)
        with torch.no_grad():
            cache = context(loaded, features, torch.tensor([sequence.shape[1]]))
            blocks = teacher_forced(loaded, cache, sequence, logits,
                                    torch.zeros(len(anchors), dtype=torch.long),
                                    torch.tensor(anchors))
        leading = (blocks.z.argmax(-1) == blocks.labels).long().cumprod(-1).sum(-1)
        assert leading.tolist() == one["accepted"][:len(anchors)]
        # and validation's decode over blocks at every anchor makes the same rounds
        walked = validate(held_out_blocks(loaded, target, [sequence[0]], [len(request)], CPU))
        assert walked["decode_rounds"] == len(anchors)
        assert walked["decode_tokens_per_round"] == pytest.approx(
            1 + sum(one["accepted"][:len(anchors)]) / len(anchors))

    blocks = lambda: held_out_blocks(loaded, target, [sequence[0]], [4], CPU)  # noqa: E731
    result, stats = validate(blocks()), statistics(blocks())
    assert stats["blocks"] == result["blocks"] == sequence.shape[1] - 4 - lane.k
    first = stats["positions"][0]
    assert first["reached"] == result["blocks"]
    assert first["accepted_if_reached"] == pytest.approx(result["acceptance_by_position"][0])


@pytest.mark.parametrize("fixed, per_prompt, batch, passes", [
    (0.02, 0.001, 8, 2.0),  # 21 ms for one prompt, 28 for eight: 20 ms whatever the prompts
    (0.02, 0.001, 1, 2.1),  # one row: a prefill is of one prompt
    (0.0, 0.004, 64, 0.0),  # each prompt's own cost alone: nothing to save by batching
])
def test_a_prefills_cost_whatever_its_prompts_in_one_token_passes(fixed, per_prompt, batch,
                                                                  passes):
    now = [0.0]

    def prefill(n: int) -> None:  # on a clock of its own
        now[0] += fixed + per_prompt * n
    sps = StepsPerSecond((batch, 2 * batch), (100.0, 80.0))  # a one-token pass: 10 ms
    assert prefill_passes(prefill, batch, sps, clock=lambda: now[0]) \
        == pytest.approx(passes, abs=1e-9)


def test_each_width_runs_as_the_fastest_at_least_as_wide():
    # widths 1..4 of 2 rows: width 2 is slow, 3 the fastest of 2 and wider
    sps = StepsPerSecond((2, 4, 6, 8), (10.0, 4.0, 8.0, 8.0))
    assert fastest_widths(sps, 2) == {1: 1, 2: 3, 3: 3, 4: 4}
    widths = by_width(sps, 2)  # the same rates, by a row's tokens
    assert (widths.tokens, widths.steps_per_second, widths.by) == (
        (1, 2, 3, 4), sps.steps_per_second, "width")


def test_the_sampler_check_counts_acceptance_where_each_position_was_reached():
    """Three rounds of k = 2, by hand: position 0 reached by all three and accepted by
    two (expected 0.5 each); position 1 reached by those two, accepted by one (expected
    0.4 and 0.6)."""
    rounds = [(torch.tensor([[0.5, 0.4], [0.5, 0.6]]), torch.tensor([1, 2])),
              (torch.tensor([[0.5, 0.9]]), torch.tensor([0]))]
    check = sampler_check(rounds)
    assert check["rounds"] == 3
    assert check["realized"] == pytest.approx([2 / 3, 1 / 2])
    assert check["expected"] == pytest.approx([0.5, 0.5])
    assert check["standard_error"] == pytest.approx([0.75 ** 0.5 / 3, 0.48 ** 0.5 / 2])
    assert check["realized_tokens_per_round"] == pytest.approx(1 + 2 / 3 + 1 / 3)
    # no round reached position 2 of k = 3: the lists stop before it
    short = sampler_check([(torch.tensor([[0.5, 0.5, 0.5]]), torch.tensor([0]))])
    assert short["realized"] == [0.0] and len(short["expected"]) == 1
    recorded: list = []
    with overlaps_recorded(recorded):
        q = torch.tensor([[[0.5, 0.5, 0.0]]])
        p = torch.tensor([[[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]])
        zero = torch.zeros(1, dtype=torch.long)
        loop.verify_rows(torch.tensor([[1]]), q, p.log(), zero, 1.0, zero, zero)
    assert recorded[0][0].tolist() == [[0.5]] and recorded[0][1].tolist() == [1]
    assert loop.verify_rows.__name__ == "verify_rows"  # restored


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_certificate_statistics_count_the_rounds_evaluate_counts(target, temperature):
    """The certified walk over held-out blocks: every pick the full walk's, as many picks
    as the positions ``evaluate.statistics`` says were reached (greedy) or as there are
    (T = 1), and each step reading between its seed alone and its seed and all of W2."""
    lane = lane_config("tiny", hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8,
                       intermediate_size=64, target_vocab_size=64, draft_vocab_size=64,
                       mask_token_id=63, target_layer_ids=[0, 2], k=3, markov_rank=16)
    drafter = random_drafter(lane, CPU, seed=0)
    torch.manual_seed(3)
    sequences = [torch.randint(0, 63, (n,)) for n in (14, 11, 17)]
    blocks = lambda: held_out_blocks(drafter, target, sequences, [4] * 3, CPU)  # noqa: E731
    counted = reads(drafter, blocks(), sequences, temperature)
    positions = statistics(blocks())["positions"]
    expected = (sum(p["reached"] for p in positions) if temperature == 0
                else sum(len(t) - 4 - lane.k for t in sequences) * lane.k)
    assert counted["picks"] == expected > 0
    assert counted["differ"] == 0
    summary = report(counted)["positions"][0]["one_request"]
    # at least the request's one seed (64 columns: one run), at most that and every row
    assert 1 / 64 <= summary["mean"] <= summary["most"] <= 65 / 64
