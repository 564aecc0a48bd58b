"""Where a runtime round's wall time goes outside its graph: each phase of Runner.draft
timed alone (synchronised before and after), with its kernel launches.

python diag/overhead.py --lane qwen36_35b_a3b --backends eager --batches 1 8
"""
import argparse
import json
import statistics
import time

import torch

from dspark_compile.artifacts import build_artifact
from dspark_compile.bench import launches, one_round
from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import lane_config
from dspark_compile.runtime import load_runner


def ms(fn, reps=50):
    for _ in range(5):
        fn()
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t) * 1e3)
    return statistics.median(out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lane", default="qwen36_35b_a3b")
    p.add_argument("--backends", nargs="+", default=["eager"])
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--root", default="/tmp/arts")
    p.add_argument("--out")
    a = p.parse_args()
    dev = torch.device("cuda")
    drafter = random_drafter(lane_config(a.lane), dev, seed=0)
    rows = []
    for backend in a.backends:
        path, _ = build_artifact(drafter, backend, a.batches, a.root)
        runner = load_runner(path, dev)
        for R in a.batches:
            prompt, decode = one_round(drafter, R, a.context, 0, dev)
            slots = [runner.admit() for _ in range(R)]
            runner.draft(prompt, slots)
            full, rws = runner.layout(decode, slots)
            bucket = runner.bucket(R)
            phases = {
                "draft": lambda: runner.draft(decode, slots),
                "check": lambda: runner._check(decode, slots),
                "layout": lambda: runner.layout(decode, slots),
                "run": lambda: runner._run(full),
                "replay": lambda: runner._calls[bucket](),
                "tensors": lambda: decode.tensors(),
            }
            row = dict(lane=a.lane, backend=backend, batch=R)
            for name, fn in phases.items():
                row[name + "_ms"] = round(ms(fn), 4)
                row[name + "_launches"] = launches(fn, dev)
            print(row, flush=True)
            rows.append(row)
            for s in slots:
                runner.release(s)
        del runner
    if a.out:
        json.dump(rows, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
