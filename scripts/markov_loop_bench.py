"""The Markov loop alone against its floor: the k steps of one draft round, as the eager
loop and as the fused Triton step, each captured in one CUDA graph, at a lane's shapes.

    python scripts/markov_loop_bench.py --lane qwen36_27b --batches 1 8 64 --out loop.json
    python scripts/markov_loop_bench.py ... --launch 128x8 256x8  # tiling: columns x warps

Only the Markov head is built (random weights drawn as ``checkpoint.random_drafter`` draws
them), with random base logits. The floor is the loop's own traffic, W2 read once per step
and the base logits ``[R, k, V]`` read once, over the copy bandwidth measured in the same
run (or its FLOPs over the matmul rate, if larger). Each batch also drafts ``--trials``
fresh rounds (odd rows sampled at T = 1) and counts the ids where the two loops differ.
``--launch`` times the fused loop at other tilings than ``fused_markov.launch_shape``'s.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from types import SimpleNamespace

import torch

from dspark_compile import fused_markov
from dspark_compile.artifacts import environment
from dspark_compile.bench import measure_ceilings, significant
from dspark_compile.config import lane_config
from dspark_compile.draft import markov_loop
from dspark_compile.model.heads import MarkovHead
from dspark_compile.model.vocab import random_d2t


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lane", default="qwen36_27b")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--launch", nargs="*", default=[],
                        help="extra fused tilings, COLUMNSxWARPS (e.g. 256x8)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    lane = lane_config(args.lane)
    gen = torch.Generator(device=device).manual_seed(0)
    head = MarkovHead(lane).to(device=device, dtype=lane.torch_dtype)
    with torch.no_grad():
        head.markov_w1.weight.normal_(0.0, 1.0, generator=gen)
        head.markov_w2.weight.normal_(0.0, lane.markov_rank ** -0.5, generator=gen)
    d2t = (random_d2t(lane.draft_vocab_size, lane.target_vocab_size, gen, device)
           if lane.has_d2t else None)
    loops = {name: SimpleNamespace(markov_head=head, d2t=d2t,
                                   lane=dataclasses.replace(lane, fused_markov_step=fused))
             for name, fused in (("loop (eager)", False), ("loop (fused)", True))}
    ceilings = measure_ceilings(device, lane.torch_dtype)
    header = dict(lane=lane.to_dict(), env=environment(device),
                  ceilings=dataclasses.asdict(ceilings))
    size = torch.finfo(lane.torch_dtype).bits // 8
    k, V, r = lane.k, lane.draft_vocab_size, lane.markov_rank
    rows = []
    for R in args.batches:
        inputs = dict(
            h=torch.zeros(R, k, lane.hidden_size, device=device, dtype=lane.torch_dtype),
            base_logits=torch.empty(R, k, V, device=device, dtype=lane.torch_dtype),
            anchor=torch.empty(R, dtype=torch.long, device=device),
            temperature=(torch.arange(R, device=device) % 2).float(),
            seed=torch.arange(R, device=device) + 7, anchor_pos=torch.full((R,), 4096,
                                                                          device=device))

        def fresh_round() -> None:
            inputs["base_logits"].normal_(generator=gen)
            inputs["anchor"].random_(0, lane.target_vocab_size, generator=gen)

        differing, compared = 0, 0
        for _ in range(args.trials):
            fresh_round()
            ids = [markov_loop(loop, **inputs, keep_logits=False)[0] for loop in loops.values()]
            differing += int((ids[0] != ids[1]).sum())
            compared += ids[0].numel()
        loop_bytes = (k * V * r + R * k * V) * size
        flops = 2 * R * k * r * V
        floor_ms = max(loop_bytes / ceilings.bandwidth, flops / ceilings.matmul) * 1e3
        default = fused_markov.launch_shape
        timed = [(name, loop, default) for name, loop in loops.items()]
        for launch in args.launch:
            block, warps = map(int, launch.split("x"))
            timed.append((f"loop (fused, {block}x{warps})", loops["loop (fused)"],
                          lambda rows, block=block, warps=warps: (default(rows)[0], block, warps)))
        for name, loop, shape in timed:
            fused_markov.launch_shape = shape
            markov_loop(loop, **inputs, keep_logits=False)  # compiles the kernel outside capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                markov_loop(loop, **inputs, keep_logits=False)
            ms = replay_ms(graph)
            rows.append(dict(lane=lane.name, batch=R, path=name, ms=significant(ms),
                             floor_ms=significant(floor_ms), vs_floor=significant(ms / floor_ms),
                             floor_bytes=loop_bytes, ids_compared=compared,
                             ids_differing=differing))
            print(f"{lane.name:14s} {R:3d} {name:24s} {ms:8.4f} ms  floor {floor_ms:.4f} ms  "
                  f"x{ms / floor_ms:.3f}  ids differing {differing}/{compared}", flush=True)
            del graph
        fused_markov.launch_shape = default
        with open(args.out, "w") as f:  # after every batch: a run cut short keeps its rows
            json.dump(dict(header, rows=rows), f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
