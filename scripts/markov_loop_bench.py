"""The Markov loop alone against its floor: the k steps of one draft round, as the eager
loop and as the fused Triton walk, each captured in one CUDA graph, at a lane's shapes.

    python scripts/markov_loop_bench.py --lane qwen36_27b --batches 1 8 64 --out loop.json
    python scripts/markov_loop_bench.py ... --launch 64x8x1 64x8x1x4  # columns x warps x
    # programs per SM [x stages of Triton's pipeline]

Only the Markov head is built (random weights drawn as ``checkpoint.random_drafter`` draws
them), with random base logits. The floor is the loop's own traffic, W2 read once per step
and the base logits ``[R, k, V]`` read once, over the copy bandwidth measured in the same
run (or its FLOPs over the matmul rate, if larger); beside each time, the time its kernels
ran and their count, from the profiler. Every batch runs greedy (T = 0, the default) and
mixed (odd rows sampled at T = 1). Each path drafts ``--trials`` fresh rounds
and counts the ids where it differs from the eager loop. ``--launch`` times the fused walk
at other launches than ``markov.launch.launch_shape``'s.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from types import SimpleNamespace
from typing import Optional

import torch
from torch import Tensor
from torch.profiler import ProfilerActivity, profile
from triton.runtime.errors import OutOfResources

from dspark_compile.kernels import markov
from dspark_compile.compile.key import environment
from dspark_compile.tools.bench import significant
from dspark_compile.tools.roofline import measure_ceilings
from dspark_compile.config import LaneConfig, lane_config
from dspark_compile.draft.markov import markov_loop
from dspark_compile.model.heads import MarkovHead
from dspark_compile.model.vocab import random_d2t


def random_head(lane: LaneConfig, gen: torch.Generator) -> tuple[MarkovHead, Optional[Tensor]]:
    """The lane's Markov head and d2t on ``gen``'s device, random as
    ``checkpoint.random_drafter`` draws them."""
    head = MarkovHead(lane).to(device=gen.device, dtype=lane.torch_dtype)
    with torch.no_grad():
        head.markov_w1.weight.normal_(0.0, 1.0, generator=gen)
        head.markov_w2.weight.normal_(0.0, lane.markov_rank ** -0.5, generator=gen)
    d2t = (random_d2t(lane.draft_vocab_size, lane.target_vocab_size, gen, gen.device)
           if lane.has_d2t else None)
    return head, d2t


def replay_ms(graph: torch.cuda.CUDAGraph, replays: int = 20, repeats: int = 7) -> float:
    """Median over ``repeats`` of the mean time of ``replays`` back-to-back replays."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    times = []
    for _ in range(repeats):
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / replays)
    return statistics.median(times)


def kernels_per_replay(graph: torch.cuda.CUDAGraph, replays: int = 10) -> tuple[float, float]:
    """(ms the kernels ran, kernels) per replay, as the profiler sees them: the rest of a
    replay's time is the time between kernels."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    return (sum(e.self_device_time_total for e in kernels) / 1e3 / replays,
            sum(e.count for e in kernels) / replays)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lane", default="qwen36_27b")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--launch", nargs="*", default=[],
                        help="extra fused launches, one per step, streaming W2: "
                             "COLUMNSxWARPSxPROGRAMS_PER_SM[xSTAGES] (e.g. 64x8x1, 64x8x1x4)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    lane = lane_config(args.lane)
    gen = torch.Generator(device=device).manual_seed(0)
    head, d2t = random_head(lane, gen)
    loops = {name: SimpleNamespace(markov_head=head, d2t=d2t,
                                   lane=dataclasses.replace(lane, fused_markov_step=fused))
             for name, fused in (("loop (eager)", False), ("loop (fused)", True))}
    ceilings = measure_ceilings(device, lane.torch_dtype)
    header = dict(lane=lane.to_dict(), env=environment(device),
                  ceilings=dataclasses.asdict(ceilings))
    size = torch.finfo(lane.torch_dtype).bits // 8
    k, V, r = lane.k, lane.draft_vocab_size, lane.markov_rank
    default = markov.launch.launch_shape
    launches = {"loop (fused)": default}
    for launch in args.launch:
        shape = tuple(map(int, launch.split("x")))
        launches[f"loop (fused, {launch})"] = (
            lambda *lane_shape, s=shape: markov.launch.Launch(default(*lane_shape).rows, *s))
    rows = []
    for R, sampled in ((R, sampled) for R in args.batches for sampled in (False, True)):
        inputs = dict(
            h=torch.zeros(R, k, lane.hidden_size, device=device, dtype=lane.torch_dtype),
            base_logits=torch.empty(R, k, V, device=device, dtype=lane.torch_dtype), state=None,
            anchor=torch.empty(R, dtype=torch.long, device=device),
            temperature=(torch.arange(R, device=device) % 2).float() * sampled,
            seed=torch.arange(R, device=device) + 7, anchor_pos=torch.full((R,), 4096,
                                                                          device=device))

        def fresh_round() -> None:
            inputs["base_logits"].normal_(generator=gen)
            inputs["anchor"].random_(0, lane.target_vocab_size, generator=gen)

        trials = []  # (base logits, anchor, the eager loop's ids)
        for _ in range(args.trials):
            fresh_round()
            ids = markov_loop(loops["loop (eager)"], **inputs, keep_logits=False)[0]
            trials.append((inputs["base_logits"].clone(), inputs["anchor"].clone(), ids))
        loop_bytes = (k * V * r + R * k * V) * size
        flops = 2 * R * k * r * V
        floor_ms = max(loop_bytes / ceilings.bandwidth, flops / ceilings.matmul) * 1e3
        timed = [("loop (eager)", loops["loop (eager)"], default)]
        timed += [(name, loops["loop (fused)"], shape) for name, shape in launches.items()]
        for name, loop, shape in timed:
            markov.launch.launch_shape = shape
            differing = 0
            try:
                for base_logits, anchor, ids in trials:
                    got = markov_loop(loop, **dict(inputs, base_logits=base_logits,
                                                   anchor=anchor), keep_logits=False)[0]
                    differing += int((got != ids).sum())
            except OutOfResources as error:  # a launch too large for this GPU
                print(f"{lane.name:14s} {R:3d} {name:28s} {error}", flush=True)
                continue
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                markov_loop(loop, **inputs, keep_logits=False)
            ms = replay_ms(graph)
            kernels_ms, kernels = kernels_per_replay(graph)
            temperature = "odd rows 1" if sampled else "0"
            rows.append(dict(lane=lane.name, batch=R, temperature=temperature, path=name,
                             ms=significant(ms), floor_ms=significant(floor_ms),
                             vs_floor=significant(ms / floor_ms), floor_bytes=loop_bytes,
                             kernels_ms=significant(kernels_ms), kernels=kernels,
                             ids_compared=args.trials * R * k, ids_differing=differing))
            print(f"{lane.name:14s} {R:3d} T={temperature:10s} {name:28s} {ms:8.4f} ms  "
                  f"floor {floor_ms:.4f} ms  x{ms / floor_ms:.3f}  kernels {kernels_ms:.4f} ms "
                  f"({kernels:g})  ids differing {differing}/{args.trials * R * k}", flush=True)
            del graph
        markov.launch.launch_shape = default
        with open(args.out, "w") as f:  # after every batch: a run cut short keeps its rows
            json.dump(dict(header, rows=rows), f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
