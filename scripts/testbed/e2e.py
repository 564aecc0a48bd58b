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
import time
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor

from data import DATA, load
from dspark_compile import lane_config, load_checkpoint, load_runner
from dspark_compile.compile import build_artifact
from dspark_compile.speculative import Request, decode
from dspark_compile.speculative.schedule import (fit_position_temperatures,
                                                 profile_steps_per_second, survival_errors,
                                                 verify_lengths)
from alone import cache_slots, sync, target_alone, target_alone_refilled
from llama import LlamaTarget
from target import LANE, load_target


def speculative(model, runner, prompts, new_tokens: list[int], temperature: float,
                graphs: bool, slots: int, device, schedule=None, rows: Optional[int] = None
                ) -> dict:
    """The package's draft -> verify loop with the target in ``rows`` rows (default: as many
    as prompts): the tokens, the accepted drafts and the confidences per round, the seconds
    in all, and those of the draft and the verification on the device's stream."""
    lane = runner.lane
    target = LlamaTarget(model, rows or len(prompts), slots, lane.target_layer_ids, lane.k + 1,
                         graphs)
    sync()
    run = decode(target, runner, [Request(p, n, seed=row) for row, (p, n)
                                  in enumerate(zip(prompts, new_tokens))], temperature,
                 schedule)
    done = run.completions
    return dict(tokens=[c.tokens for c in done],
                accepted=[a for c in done for a in c.accepted],
                verified=[v for c in done for v in c.verified],
                confidences=[x for c in done for x in c.confidences], spec_s=run.seconds,
                draft_s=run.draft_seconds, verify_s=run.verify_seconds)


def summary(k: int, accepted: list[int], confidences: list[list[float]]) -> dict:
    """Acceptance per draft position (of the rounds) and, where a position was reached, the
    drafter's mean confidence there against how often it was accepted."""
    rounds = len(accepted)
    reached = [[a >= i for a in accepted] for i in range(k)]
    return dict(rounds=rounds, tokens_per_round=sum(accepted) / rounds + 1,
                acceptance_by_position=[sum(a > i for a in accepted) / rounds for i in range(k)],
                accepted_if_reached=[sum(a > i for a, r in zip(accepted, reached[i]) if r)
                                     / max(1, sum(reached[i])) for i in range(k)],
                confidence_if_reached=[sum(c[i] for c, r in zip(confidences, reached[i]) if r)
                                       / max(1, sum(reached[i])) for i in range(k)])


def measure(model, runner, held_out: list[list[int]], lengths: list[int], batch: int,
            temperature: float, graphs: bool, device, schedule=None, refill: bool = False
            ) -> dict:
    """Both arms over the held-out prompts, ``batch`` at a time (in groups that run until
    their longest request ends, or with ``refill`` through ``batch`` rows that take the next
    prompt as one ends): seconds, the rounds' accepted and verified drafts and confidences,
    greedy identity and where outputs part."""
    k, taps = runner.lane.k, runner.lane.target_layer_ids
    run = dict(generated=0, base_s=0.0, spec_s=0.0, draft_s=0.0, verify_s=0.0, accepted=[],
               verified=[], confidences=[], same=0, compared=0, diverged=[])
    size = len(held_out) if refill else batch
    for first in range(0, len(held_out) - size + 1, size):
        group, wanted = held_out[first:first + size], lengths[first:first + size]
        slots = cache_slots(group, max(wanted), k)
        if refill:
            alone, seconds = target_alone_refilled(model, group, wanted, temperature, graphs,
                                                   taps, slots, device, batch)
        else:
            alone, _, seconds = target_alone(model, group, wanted, temperature, graphs, taps,
                                             slots, device)
        spec = speculative(model, runner, group, wanted, temperature, graphs, slots, device,
                           schedule, rows=batch)
        run["generated"] += sum(wanted)
        run["base_s"] += seconds
        for key in ("spec_s", "draft_s", "verify_s"):
            run[key] += spec[key]
        for key in ("accepted", "verified", "confidences"):
            run[key] += spec[key]
        run["same"] += sum(a == b for a, b in zip(alone, spec["tokens"]))
        # where greedy outputs part: the target's own margin there (a pass of k+1 tokens
        # rounds its logits otherwise than a pass of one), from a run of its own, untimed
        parted = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
                  for a, b in zip(alone, spec["tokens"])]
        if temperature == 0 and any(i is not None for i in parted):
            _, gaps, _ = target_alone(model, group, wanted, temperature, graphs, taps, slots,
                                      device, True)
            run["diverged"] += [dict(request=first + r, position=i, gap=gaps[r][i])
                                for r, i in enumerate(parted) if i is not None]
        run["compared"] += len(group)
    return run


def scheduler(model, run: dict, batch: int, graphs: bool, k: int, taps, slots: int, device):
    """Algorithm 1 over the target's SPS, profiled at every verify width of ``batch`` rows,
    on confidences calibrated by STS fitted on the first half of ``run``'s rounds; with the
    calibration error per position on the other half before and after STS."""
    confidences, accepted = torch.tensor(run["confidences"]), torch.tensor(run["accepted"])
    half = len(accepted) // 2
    sts = fit_position_temperatures(confidences[:half], accepted[:half])
    target = LlamaTarget(model, batch, slots, taps, k + 1, graphs)
    start = torch.zeros(batch, dtype=torch.long, device=device)

    def verify_step(tokens: int) -> None:
        target.verify(torch.zeros(batch, tokens // batch, dtype=torch.long, device=device),
                      start)
        sync()
    sps = profile_steps_per_second(verify_step, [batch * n for n in range(1, k + 2)])
    fitted = dict(sts=sts.temperatures, sps=dict(zip(sps.tokens, sps.steps_per_second)),
                  calibration_error=survival_errors(confidences[half:], accepted[half:]),
                  calibration_error_sts=survival_errors(sts(confidences[half:]),
                                                        accepted[half:]))
    return (lambda c: verify_lengths(sts(c), sps)), fitted


def fixed_length(length: int, confidences: Tensor) -> Tensor:
    """A schedule that verifies ``length`` drafts of every request."""
    return torch.full(confidences.shape[:1], length, dtype=torch.long)


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
               verified_per_round=sum(run["verified"]) / max(1, len(run["verified"])),
               **summary(k, run["accepted"], run["confidences"]))
    if temperature == 0:
        row["identical_to_target_greedy"] = f"{run['same']}/{run['compared']}"
        row["divergences"] = run["diverged"]
    print(json.dumps({key: round(v, 3) if isinstance(v, float) else v
                      for key, v in row.items() if not isinstance(v, (list, dict))}),
          row.get("divergences", ""), flush=True)
    return row


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
    parser.add_argument("--prompts", type=int, default=16, help="held-out prompts per run")
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
                        help="also verify per request the drafts Algorithm 1 picks, from "
                             "STS-calibrated confidences and the target's profiled SPS")
    parser.add_argument("--blas", default="cublaslt", choices=["cublas", "cublaslt"],
                        help="the GEMM library on CUDA, both arms: cuBLASLt takes an fp32 "
                             "pass of 8 tokens in 5.4 ms where cuBLAS takes 8.2 (passes.py)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.preferred_blas_library(args.blas)
    graphs_options = [g == "graph" for g in args.targets if device.type == "cuda" or g == "eager"]
    model = load_target(args.target, device)
    sequences, prompt_lengths = load(args.data).select(held_out=True, modes=("greedy",))
    held_out = [t[:n].tolist() for t, n in zip(sequences, prompt_lengths)][:args.prompts]
    lengths = [min(args.new_tokens, len(t) - n) if args.to_end_of_answer else args.new_tokens
               for t, n in zip(sequences, prompt_lengths)][:args.prompts]
    drafter = load_checkpoint(args.drafter, lane_config(LANE), device, verifier=args.target)
    taps, k = drafter.lane.target_layer_ids, drafter.lane.k
    rows = []
    for temperature in args.temperatures:
        for backend in args.backends:
            path, _ = build_artifact(drafter, backend, args.batches, args.artifacts_dir,
                                     with_probs=temperature > 0)
            runner = load_runner(path, device)
            for batch in args.batches:
                for graphs in graphs_options:
                    def arm(schedule, name: str) -> tuple[dict, dict]:
                        run = measure(model, runner, held_out, lengths, batch, temperature,
                                      graphs, device, schedule, args.refill)
                        row = report(run, args, backend, batch, temperature, graphs, k, name)
                        rows.append(row)
                        return run, row
                    every, every_row = arm(None, "every draft")
                    for fixed in args.fixed_lengths:
                        arm(functools.partial(fixed_length, fixed), f"{fixed} drafts")
                    if args.schedule and drafter.lane.confidence_head:
                        schedule, fitted = scheduler(
                            model, every, batch, graphs, k, taps,
                            cache_slots(held_out, args.new_tokens, k), device)
                        every_row.update(fitted)
                        arm(schedule, "algorithm 1 with STS")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(rows=rows, lane=drafter.lane.to_dict()), indent=2))
    print(args.out)


if __name__ == "__main__":
    main()
