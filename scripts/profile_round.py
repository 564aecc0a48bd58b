"""Where one draft round's time goes: each phase of ``Runner.draft`` timed alone, the GPU
time of the round's kernels (CUDA graph kernels included) against its wall time, and the
kernels of one round as the profiler sees them, per backend.

    python scripts/profile_round.py --lane qwen36_27b --set fused_markov_step=true \
        fused_attention=true --backends inductor aoti --batch 1 --trace-dir traces
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from dspark_compile.compile import build_artifact
from dspark_compile.tools.rounds import synthetic_rounds
from dspark_compile.tools.timing import time_ms
from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import lane_config
from dspark_compile.draft import RoundInputs
from dspark_compile.model import Drafter
from dspark_compile.runtime import load_runner
from dspark_compile.runtime.capture import copy_into


def gpu_time(prof: profile) -> tuple[float, float]:
    """(sum of kernel and memcpy durations, first start to last end), in ms."""
    spans = [(e.time_range.start, e.time_range.end) for e in prof.events()
             if e.device_type == torch.autograd.DeviceType.CUDA]
    if not spans:
        return 0.0, 0.0
    busy = sum(end - start for start, end in spans) / 1e3
    return busy, (max(end for _, end in spans) - min(start for start, _ in spans)) / 1e3


def profile_backend(drafter: Drafter, backend: str, prompt: RoundInputs, decode: RoundInputs,
                    args: argparse.Namespace) -> dict[str, float]:
    """Phase timings of one backend's runner; prints its kernel table, writes its trace."""
    device = drafter.fc.weight.device
    path, _ = build_artifact(drafter, backend, args.buckets or [args.batch], args.root)
    runner = load_runner(path, device)
    slots = [runner.admit() for _ in range(args.batch)]
    bucket = runner.bucket(args.batch)
    runner.draft(prompt, slots)
    phases = {
        "round": lambda: runner.draft(decode, slots),
        "check": lambda: runner._check(decode, slots),
        "replay": lambda: runner.replay(args.batch),
        "copy_in": lambda: copy_into(runner._inputs[bucket],
                                     runner._with_defaults(decode).tensors(),
                                     runner._input_bytes[bucket]),
    }
    with torch.no_grad():
        timed = {name: time_ms(fn, device, args.repeats, warmup=5)
                 for name, fn in phases.items()}
    timed["host_work"] = timed["round"] - timed["replay"]  # all but the graph's replay
    activities = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * (device.type == "cuda")
    with profile(activities=activities) as prof:
        runner.draft(decode, slots)
    timed["gpu_busy"], timed["gpu_span"] = gpu_time(prof)
    print(f"\n== {args.lane} {args.set} batch {args.batch} context {args.context}: "
          f"runtime ({backend})")
    print("  ".join(f"{name} {ms:.4f} ms" for name, ms in timed.items()))
    sort = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=args.top,
                                    max_name_column_width=70))
    if args.trace_dir:
        args.trace_dir.mkdir(parents=True, exist_ok=True)
        trace = args.trace_dir / f"{args.lane}_b{args.batch}_{backend}.json"
        prof.export_chrome_trace(str(trace))
        with trace.open("rb") as src, gzip.open(f"{trace}.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        trace.unlink()
    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lane", default="tiny")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="lane overrides, e.g. fused_markov_step=true")
    parser.add_argument("--backends", nargs="+", default=["eager"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--buckets", type=int, nargs="+", help="artifact buckets; default: batch")
    parser.add_argument("--context", type=int,
                        help="context rows; default 4096, or what the lane's cache holds")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--root", default="artifacts")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--trace-dir", type=Path, help="write each backend's chrome trace here")
    parser.add_argument("--json", type=Path, help="write the phase timings here")
    args = parser.parse_args()
    device = torch.device(args.device)
    overrides = dict(item.split("=", 1) for item in args.set)
    drafter = random_drafter(lane_config(args.lane, **overrides), device, seed=0)
    lane = drafter.lane
    args.context = args.context or min(4096, lane.max_context - 4 * (lane.k + 1))
    prompt, decode = synthetic_rounds(lane, args.batch, args.context, 2, 0, device,
                                      fixed=True)
    results = {backend: profile_backend(drafter, backend, prompt, decode, args)
               for backend in args.backends}
    if args.json:
        args.json.write_text(json.dumps({"lane": args.lane, "overrides": overrides,
                                         "batch": args.batch, "context": args.context,
                                         "ms": results}, indent=1))


if __name__ == "__main__":
    main()
