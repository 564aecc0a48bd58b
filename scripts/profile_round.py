"""Where one draft round's GPU time goes: the kernels of one decode round through the
runtime, per backend, as the profiler sees them (CUDA graph kernels included).

    python scripts/profile_round.py --lane qwen36_27b --backends eager inductor --batch 1
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from dspark_compile.artifacts import build_artifact
from dspark_compile.bench import one_round
from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import lane_config
from dspark_compile.runtime import load_runner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lane", default="tiny")
    parser.add_argument("--backends", nargs="+", default=["eager"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--buckets", type=int, nargs="+", help="artifact buckets; default: batch")
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--root", default="artifacts")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    device = torch.device(args.device)
    drafter = random_drafter(lane_config(args.lane), device, seed=0)
    prompt, decode = one_round(drafter, args.batch, args.context, 0, device)
    for backend in args.backends:
        path, _ = build_artifact(drafter, backend, args.buckets or [args.batch], args.root)
        runner = load_runner(path, device)
        slots = [runner.admit() for _ in range(args.batch)]
        runner.draft(prompt, slots)
        for _ in range(5):
            runner.draft(decode, slots)
        activities = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * (device.type == "cuda")
        with profile(activities=activities) as prof:
            runner.draft(decode, slots)
        events = prof.key_averages()
        sort = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
        print(f"\n== {args.lane} batch {args.batch} context {args.context}: runtime ({backend})")
        print(events.table(sort_by=sort, row_limit=args.top, max_name_column_width=70))
        del runner


if __name__ == "__main__":
    main()
