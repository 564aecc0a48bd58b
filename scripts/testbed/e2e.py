"""The trained drafter end to end: compiled (``inductor``, ``aoti``), loaded by the runtime,
drafting for the real target on held-out prompts, greedy and sampled, at batch 1 and a
batch of several requests. Against the same target generating alone, with the same target
implementation (``llama.StaticLlama``) in both arms, eager and captured as CUDA graphs.

    python scripts/testbed/e2e.py --target testbed/target --drafter testbed/drafter \
        --out e2e.json
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path
from typing import Optional

import torch

from data import DATA, load
from dspark_compile import lane_config, load_checkpoint, load_runner
from dspark_compile.compile import build_artifact
from dspark_compile.speculative import (DraftPolicy, MaxDraftRows, Request, WhileDraftingPays,
                                        decode)
from dspark_compile.speculative.acceptance import verify_rows
from alone import Alone, baseline, cache_slots, groups, sync, target_alone
from llama import LlamaTarget
from scheduling import (by_width, calibration, fastest_widths, fixed_length,
                        overlaps_recorded, prefill_of, prefill_passes, sampler_check,
                        steps_per_second)
from target import LANE, load_target


def speculative(model, runner, prompts, new_tokens: list[int], temperature: float,
                graphs: bool, slots: int, device, schedule=None, rows: Optional[int] = None,
                pad: Optional[dict[int, int]] = None, drafting: Optional[DraftPolicy] = None,
                refill_wait: float = 0.0) -> dict:
    """The package's draft -> verify loop with the target in ``rows`` rows (default: as many
    as prompts; ``pad``: LlamaTarget's; ``drafting``, ``refill_wait``: decode's), request
    ``i`` seeded
    ``i``: the tokens, the accepted and verified drafts and the confidences per round, the
    seconds in all, and those of the draft and the verification on the device's stream,
    and the passes."""
    lane = runner.lane
    target = LlamaTarget(model, rows or len(prompts), slots, lane.target_layer_ids, lane.k + 1,
                         graphs, pad)
    sync()
    run = decode(target, runner, [Request(p, n, seed=i) for i, (p, n)
                                  in enumerate(zip(prompts, new_tokens))], temperature,
                 schedule, drafting, refill_wait)
    done = run.completions
    return dict(tokens=[c.tokens for c in done],
                accepted=[a for c in done for a in c.accepted],
                verified=[v for c in done for v in c.verified],
                confidences=[x for c in done for x in c.confidences], spec_s=run.seconds,
                draft_s=run.draft_seconds, verify_s=run.verify_seconds,
                prefill_s=run.prefill_seconds, handoff_s=run.handoff_seconds,
                passes=run.passes,
                busy_tokens=run.busy_tokens, busy_s=run.busy_seconds)


def summary(k: int, accepted: list[int], confidences: list[list[float]]) -> dict:
    """Acceptance per draft position (of the rounds) and, where a position was reached, the
    drafter's mean confidence there against how often it was accepted."""
    rounds = len(accepted)
    if not rounds:  # the target's own steps alone
        return dict(rounds=0)
    reached = [[a >= i for a in accepted] for i in range(k)]
    return dict(rounds=rounds, tokens_per_round=sum(accepted) / rounds + 1,
                acceptance_by_position=[sum(a > i for a in accepted) / rounds for i in range(k)],
                accepted_if_reached=[sum(a > i for a, r in zip(accepted, reached[i]) if r)
                                     / max(1, sum(reached[i])) for i in range(k)],
                confidence_if_reached=[sum(c[i] for c, r in zip(confidences, reached[i]) if r)
                                       / max(1, sum(reached[i])) for i in range(k)])


def measure(model, runner, prompts, wanted: list[int], batch: int, temperature: float,
            graphs: bool, device, alone: Alone, schedule=None, refill: bool = False,
            pad: Optional[dict[int, int]] = None, drafting: Optional[DraftPolicy] = None,
            refill_wait: float = 0.0) -> dict:
    """The speculative arm over the requests, as :func:`baseline` ran them (``alone``, its
    result): seconds, the rounds' accepted and verified drafts and confidences, greedy
    identity and where outputs part."""
    k, taps = runner.lane.k, runner.lane.target_layer_ids
    slots = cache_slots(prompts, max(wanted), k)
    run = dict(generated=sum(wanted), base_s=alone[1], spec_s=0.0, draft_s=0.0, verify_s=0.0,
               prefill_s=0.0, handoff_s=0.0, passes=0, accepted=[], verified=[],
               confidences=[], tokens=[], busy_tokens=0, busy_s=0.0, base_busy=alone[2],
               base_prefill_s=alone[3])
    for group in groups(len(prompts), batch, refill):
        spec = speculative(model, runner, prompts[group], wanted[group], temperature, graphs,
                           slots, device, schedule, batch, pad, drafting, refill_wait)
        for key in ("spec_s", "draft_s", "verify_s", "prefill_s", "handoff_s", "passes",
                    "busy_tokens", "busy_s"):
            run[key] += spec[key]
        for key in ("accepted", "verified", "confidences", "tokens"):
            run[key] += spec[key]
    run["compared"] = len(run["tokens"])
    run["same"] = sum(a == b for a, b in zip(alone[0], run["tokens"]))
    # where greedy outputs part: the target's own margin there (a pass of k+1 tokens rounds
    # its logits otherwise than a pass of one), from a run of its own, untimed
    run["diverged"] = []
    for request, (a, b) in enumerate(zip(alone[0], run.pop("tokens"))):
        parted = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if temperature == 0 and parted is not None:
            _, gaps, _ = target_alone(model, [prompts[request]], [wanted[request]], 0.0,
                                      graphs, taps, slots, device, True)
            run["diverged"].append(dict(request=request, position=parted, gap=gaps[0][parted]))
    return run


def report(run: dict, args, backend: str, batch: int, temperature: float, graphs: bool,
           k: int, schedule: str) -> dict:
    """One row of the results, printed as it is made."""
    row = dict(backend=backend, batch=batch, temperature=temperature, schedule=schedule,
               refill=args.refill, blas=args.blas, target_graphs=graphs,
               requests=run["compared"],
               new_tokens=args.new_tokens, to_end_of_answer=args.to_end_of_answer,
               generated=run["generated"],
               target_alone_tokens_per_s=run["generated"] / run["base_s"],
               speculative_tokens_per_s=run["generated"] / run["spec_s"],
               speedup=run["base_s"] / run["spec_s"], draft_share=run["draft_s"] / run["spec_s"],
               verify_share=run["verify_s"] / run["spec_s"],
               prefill_share=run["prefill_s"] / run["spec_s"],
               handoff_share=run["handoff_s"] / run["spec_s"],
               target_alone_prefill_share=None if run["base_prefill_s"] is None
               else run["base_prefill_s"] / run["base_s"],
               verified_per_round=sum(run["verified"]) / max(1, len(run["verified"])),
               passes=run["passes"], tokens_per_pass=run["generated"] / run["passes"],
               outside_pass_ms=1e3 * (run["spec_s"] - run["verify_s"] - run["prefill_s"])
               / run["passes"], **summary(k, run["accepted"], run["confidences"]))
    base_tokens, base_s = run["base_busy"]
    if run["busy_tokens"] and base_tokens:  # refilled, and more requests than rows
        row.update(target_alone_busy_tokens_per_s=base_tokens / base_s,
                   speculative_busy_tokens_per_s=run["busy_tokens"] / run["busy_s"],
                   busy_speedup=run["busy_tokens"] / run["busy_s"] * base_s / base_tokens)
    if temperature == 0:
        row["identical_to_target_greedy"] = f"{run['same']}/{run['compared']}"
        row["divergences"] = run["diverged"]
    print(json.dumps({key: round(v, 3) if isinstance(v, float) else v
                      for key, v in row.items() if not isinstance(v, (list, dict))}),
          row.get("divergences", ""), flush=True)
    return row


def save(rows: list[dict], lane, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(rows=rows, lane=lane.to_dict()), indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, default=Path("testbed/target"))
    parser.add_argument("--drafter", type=Path, default=Path("testbed/drafter"))
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--out", type=Path, default=Path("bench_out/testbed_e2e.json"))
    parser.add_argument("--backends", nargs="+", default=["inductor", "aoti"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 1.0])
    parser.add_argument("--targets", nargs="+", default=["eager", "graph"],
                        choices=["eager", "graph"], help="the target eager, captured, or both")
    parser.add_argument("--prompts", type=int, default=16,
                        help="requests per run (held-out prompts, again with other seeds "
                             "past the 32); with --refill at least twice the batch")
    parser.add_argument("--new-tokens", type=int, default=256, help="the most a prompt gets")
    parser.add_argument("--to-end-of-answer", action=argparse.BooleanOptionalAction,
                        default=True, help="each prompt as many tokens as its held-out greedy "
                        "answer has (it ends at the end of turn), up to --new-tokens")
    parser.add_argument("--artifacts-dir", default="artifacts")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--refill", action="store_true",
                        help="both arms through `batch` rows that take the next prompt as soon "
                             "as a request ends, not in groups run to their longest request")
    parser.add_argument("--fixed-lengths", type=int, nargs="*", default=[],
                        help="also verify this many drafts a round, each (e.g. 1 2 3)")
    parser.add_argument("--schedule", action="store_true",
                        help="STS fitted on a run of the drafter first (eager backend, the "
                             "first batch, every draft) and built into the artifacts (at "
                             "T > 0 the same run checks the sampler); then also the drafts "
                             "Algorithm 1 picks per request (SPS by tokens) and the width "
                             "schedule picks (SPS by width: this target pads every row to "
                             "the widest), both in the runner's graph, and the width "
                             "schedule (5.2) from each request's confidences of two rounds "
                             "before, on the host; over the round's rates: the target's "
                             "profiled SPS, padded, with the every-draft arm's time outside "
                             "the pass (the prompts' prefills apart) added")
    parser.add_argument("--max-draft-rows", type=int, nargs="*", default=[],
                        help="also, for each N below the batch, rounds of more than N "
                             "requests as the target's own steps, no draft (the width "
                             "schedule's rounds, or every draft's without --schedule)")
    parser.add_argument("--while-pays", action="store_true",
                        help="with --schedule: also the width schedule's rounds where they "
                             "make more tokens a second than the target's own steps, by "
                             "the round's rates and the tokens drafted rounds made so far "
                             "(WhileDraftingPays), own steps otherwise (an own step: the "
                             "one-token pass and the every-draft arm's time outside the pass "
                             "less its draft)")
    parser.add_argument("--batched-refill", action="store_true",
                        help="with --refill: freed rows wait to be refilled together "
                             "(Refills), for as many passes as a prefill costs this target "
                             "whatever its prompts (profiled per batch); the target alone "
                             "runs both ways and the faster is the baseline")
    parser.add_argument("--pad", action=argparse.BooleanOptionalAction, default=True,
                        help="the speculative arms' target runs each verify width as the "
                             "fastest profiled width at least as wide")
    parser.add_argument("--blas", default="cublaslt", choices=["cublas", "cublaslt"],
                        help="the GEMM library on CUDA, both arms: cuBLASLt takes an fp32 "
                             "pass of 8 tokens in 5.4 ms where cuBLAS takes 8.2 (passes.py)")
    args = parser.parse_args()
    max_batch = lane_config(LANE).max_batch
    if max(args.batches) > max_batch:
        parser.error(f"--batches {args.batches}: at most the lane's max_batch, {max_batch}")
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.preferred_blas_library(args.blas)
    graphs_options = [g == "graph" for g in args.targets if device.type == "cuda" or g == "eager"]
    model = load_target(args.target, device)
    sequences, prompt_lengths = load(args.data).select(held_out=True, modes=("greedy",))
    prompts = [t[:n].tolist() for t, n in zip(sequences, prompt_lengths)]
    answers = [min(args.new_tokens, len(t) - n) if args.to_end_of_answer else args.new_tokens
               for t, n in zip(sequences, prompt_lengths)]
    drafter = load_checkpoint(args.drafter, lane_config(LANE), device, verifier=args.target)
    taps, k = drafter.lane.target_layer_ids, drafter.lane.k
    if device.type == "cuda":  # the verifier's kernel compiles at its first launch, with
        # verify lengths and without: here, not in a timed arm
        zero = torch.zeros(1, dtype=torch.long, device=device)
        q = torch.zeros(1, k, drafter.lane.target_vocab_size, device=device)
        for lengths in (None, zero):
            verify_rows(zero.new_zeros(1, k), q, q.new_zeros(1, k + 1, q.shape[-1]), zero,
                        1.0, zero, zero, lengths)
    scheduling = args.schedule and drafter.lane.confidence_head
    rows, calibrations = [], {}

    def requests(batch: int) -> tuple[list[list[int]], list[int]]:
        count = max(args.prompts, 2 * batch) if args.refill else args.prompts
        return ([prompts[i % len(prompts)] for i in range(count)],
                [answers[i % len(prompts)] for i in range(count)])
    for temperature in args.temperatures:
        drafter.calibrate(None)
        if scheduling:  # STS from a run of the drafter as it is (eager: no compile)
            path, _ = build_artifact(drafter, "eager", args.batches[:1], args.artifacts_dir,
                                     with_probs=temperature > 0)
            chosen, wanted = requests(args.batches[0])
            checked: list = []
            with overlaps_recorded(checked):
                record = speculative(model, load_runner(path, device), chosen, wanted,
                                     temperature, graphs_options[-1],
                                     cache_slots(chosen, max(wanted), k), device,
                                     rows=args.batches[0])
            sts, calibrations[temperature] = calibration(record)
            if checked:
                calibrations[temperature]["sampler_check"] = sampler_check(checked)
            drafter.calibrate(sts.temperatures)
            print(json.dumps(dict(temperature=temperature, **calibrations[temperature])),
                  flush=True)
        for backend in args.backends:
            path, _ = build_artifact(drafter, backend, args.batches, args.artifacts_dir,
                                     with_probs=temperature > 0)
            runner = load_runner(path, device)
            for batch in args.batches:
                chosen, wanted = requests(batch)
                slots = cache_slots(chosen, max(wanted), k)
                for graphs in graphs_options:
                    sps = steps_per_second(model, batch, graphs, k, taps, slots, device)
                    pad = fastest_widths(sps, batch) if args.pad else None
                    wait = prefill_passes(prefill_of(model, batch, taps, slots, chosen[0]),
                                          batch, sps) \
                        if args.batched_refill and args.refill else 0.0
                    # the target alone refilled both ways: the faster is the baseline
                    alones = {w: baseline(model, chosen, wanted, batch, temperature, graphs,
                                          taps, slots, device, args.refill, w)
                              for w in dict.fromkeys((0.0, wait))}
                    alone_wait = min(alones, key=lambda w: alones[w][1])
                    alone = alones[alone_wait]
                    refills = dict(refill_wait=wait, target_alone_refill_wait=alone_wait,
                                   target_alone_tokens_per_s_by_refill_wait={
                                       w: sum(wanted) / a[1] for w, a in alones.items()})

                    def arm(name: str, schedule=None, drafting=None) -> dict:
                        run = measure(model, runner, chosen, wanted, batch, temperature,
                                      graphs, device, alone, schedule, args.refill, pad,
                                      drafting, wait)
                        row = report(run, args, backend, batch, temperature, graphs, k, name)
                        rows.append(row | dict(pad=pad) | refills)
                        save(rows, drafter.lane, args.out)  # a run cut short keeps its rows
                        return rows[-1]
                    every = arm("every draft")
                    every.update(calibrations.get(temperature, {}))
                    for fixed in args.fixed_lengths:
                        arm(f"{fixed} drafts", functools.partial(fixed_length, fixed))
                    if scheduling:  # both weigh tokens against the whole round
                        outside = every["outside_pass_ms"] / 1e3
                        for name, profiled in (("algorithm 1", sps),
                                               ("by width", by_width(sps, batch))):
                            rates = (profiled.padded() if args.pad else profiled
                                     ).with_overhead(outside)
                            runner.schedule(rates)
                            arm(name)["sps"] = dict(
                                profiled=dict(zip(profiled.tokens, profiled.steps_per_second)),
                                round=dict(zip(rates.tokens, rates.steps_per_second)))
                        runner.schedule(rates, lag=2)  # 5.2, over the width's rates
                        arm("by width, confidences two rounds old")
                        runner.schedule(rates)
                        if args.while_pays:  # an own step: its pass, and the round's work
                            # outside the pass but the draft (both sides charged alike)
                            draft = every["draft_share"] * every["generated"] / (
                                every["speculative_tokens_per_s"] * every["passes"])
                            own = 1 / (1 / sps.steps_per_second[0] + max(0.0, outside - draft))
                            arm("by width, own steps while drafting does not pay",
                                drafting=WhileDraftingPays(rates, own))
                    for most in [m for m in args.max_draft_rows if m < batch]:
                        arm(("by width" if scheduling else "every draft")
                            + f", the target's own steps above {most} rows",
                            drafting=MaxDraftRows(most))
                    runner.schedule(None)
    save(rows, drafter.lane, args.out)
    print(args.out)


if __name__ == "__main__":
    main()
