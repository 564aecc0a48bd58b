"""The speculative loop's own time a round: what ``decode`` spends outside the target's pass
(the draft, the verification, the host's work), with a target whose pass is two table
lookups (``tools.bigram``), so nearly all of a round is the loop's and the runner's; its
greedy text is the walk of argmax over its table, which the greedy rows check. The drafter
has random weights, so few drafts are accepted: the figure is the cost a round pays, not a
speedup.

    python scripts/loop_overhead.py --batches 1 8 64 --temperatures 0 1 --out overhead.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional

import torch

from dspark_compile.checkpoint import random_drafter
from dspark_compile.compile import build_artifact
from dspark_compile.compile.key import environment
from dspark_compile.config import lane_config
from dspark_compile.runtime import load_runner
from dspark_compile.speculative import MaxDraftRows, Request, decode
from dspark_compile.tools.bigram import BigramTarget


def measure(runner, target: BigramTarget, requests: list[Request], temperature: float,
            max_draft_rows: Optional[int] = None) -> dict:
    """One untimed run, then a timed one: ms a round in all, in the draft (its stream
    marks), in the target's pass, and outside the pass; greedy, whether every request got
    the bigram walk."""
    for _ in range(2):  # a fresh policy each run
        policy = None if max_draft_rows is None else MaxDraftRows(max_draft_rows)
        run = decode(target, runner, requests, temperature, drafting=policy)
    rounds = run.passes
    row = dict(rounds=rounds, tokens_per_round=sum(len(c.tokens) for c in run.completions)
               / rounds, ms_per_round=1e3 * run.seconds / rounds,
               draft_ms=1e3 * run.draft_seconds / rounds,
               pass_ms=1e3 * run.verify_seconds / rounds,
               outside_pass_ms=1e3 * (run.seconds - run.verify_seconds - run.prefill_seconds)
               / rounds)
    if temperature == 0:
        row["greedy_walks"] = sum(
            c.tokens == target.greedy(r.prompt, r.max_new_tokens)
            for c, r in zip(run.completions, requests))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lane", default="tiny")
    parser.add_argument("--vocab", type=int, default=None,
                        help="the lane's vocabulary instead (its tables are vocab x vocab)")
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--max-draft-rows", type=int, default=None,
                        help="decode's: rounds of more requests are the target's own steps "
                             "(0: every round)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--artifacts-dir", default="artifacts")
    parser.add_argument("--out", type=Path, default=Path("bench_out/loop_overhead.json"))
    args = parser.parse_args()
    device = torch.device(args.device)
    overrides = dict(max_batch=max(args.batches))
    if args.vocab:
        overrides.update(target_vocab_size=args.vocab, draft_vocab_size=args.vocab)
    lane = lane_config(args.lane, **overrides)
    drafter = random_drafter(lane, device, seed=0)
    rows = []
    for temperature in args.temperatures:
        path, _ = build_artifact(drafter, args.backend, args.batches, args.artifacts_dir,
                                 with_probs=temperature > 0)
        runner = load_runner(path, device)
        for batch in args.batches:
            target = BigramTarget(lane.target_vocab_size, lane.feature_size, batch, device)
            requests = [Request([1 + i, 2, 3], args.new_tokens, seed=i) for i in range(batch)]
            row = dict(backend=args.backend, temperature=temperature, batch=batch,
                       max_draft_rows=args.max_draft_rows,
                       **measure(runner, target, requests, temperature, args.max_draft_rows))
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v
                              for k, v in row.items()}), flush=True)
            rows.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(lane=lane.to_dict(), env=environment(device),
                                        rows=rows), indent=2))
    print(args.out)


if __name__ == "__main__":
    main()
