"""The Markov loop alone against its floor: the k steps of one draft round, as the eager
loop and as the fused Triton walk, each captured in one CUDA graph, at a lane's shapes.

    python scripts/markov_loop_bench.py --lane qwen36_27b --batches 1 8 64 --out loop.json
    python scripts/markov_loop_bench.py ... --launch 64x8x1 64x8x1x4  # columns x warps x
    # programs per SM [x stages of Triton's pipeline]
    python scripts/markov_loop_bench.py ... --spreads 1 8 32  # base logits' std

Only the Markov head is built (random weights drawn as ``checkpoint.random_drafter`` draws
them), with random base logits. The floor is the loop's own traffic, W2 read once per step
and the base logits ``[R, k, V]`` read once, over the copy bandwidth measured in the same
run (or its FLOPs over the matmul rate, if larger); beside each time, the time its kernels
ran and their count, from the profiler. Every batch runs greedy (T = 0, the default) and
mixed (odd rows sampled at T = 1). Each path drafts ``--trials`` fresh rounds
and counts the ids where it differs from the eager loop. ``--launch`` times the fused walk
at other launches than ``markov.launch.launch_shape``'s. The certified walk
(``kernels.markov.certified_markov_walk``) reads the rows of W2 that can still win: on
random weights with unit-variance base logits that is nearly all of them; ``--spreads``
widens the base logits (a std of 8 or 32), so that fewer columns can win, and reports the
fraction of W2's rows it read; ``--rounds`` takes real rounds instead (``tiled_head``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from types import SimpleNamespace
from typing import Callable, Optional

import torch
from safetensors.torch import load_file
from torch import Tensor
from torch.profiler import ProfilerActivity, profile
from triton.runtime.errors import OutOfResources

from dspark_compile.kernels import markov
from dspark_compile.compile.key import environment
from dspark_compile.tools.bench import significant
from dspark_compile.tools.roofline import measure_ceilings
from dspark_compile.config import LaneConfig, lane_config
from dspark_compile.draft.markov import markov_loop
from dspark_compile.model.heads import MarkovHead, row_norms
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


def tiled_head(lane: LaneConfig, path: str, device: torch.device
               ) -> tuple[LaneConfig, MarkovHead, Tensor, Tensor]:
    """Real rounds in the lane's geometry (``testbed/certificate.py --rounds-out``): W1 and
    W2 zero-padded to the lane's rank (the same products and norms), W2's rows, W1's rows
    and the base logits' columns repeated over the lane's vocabularies (a copy of a column
    ties with it, so the first copy's pick is the drafter's own), k the rounds' own, no
    d2t. The lane, its head, the base logits ``[N, k, V]`` and anchors ``[N]``."""
    saved = load_file(path, device=str(device))
    base, anchor, w1, w2 = saved["base"], saved["anchor"], saved["w1"], saved["w2"]
    n, rank = w2.shape
    lane = dataclasses.replace(lane, k=base.shape[1], draft_vocab_size=lane.target_vocab_size)
    head = MarkovHead(lane).to(device=device, dtype=lane.torch_dtype)
    with torch.no_grad():
        head.markov_w1.weight.zero_()[:, :rank] = w1[torch.arange(lane.target_vocab_size) % n]
        head.markov_w2.weight.zero_()[:, :rank] = w2[torch.arange(lane.draft_vocab_size) % n]
    return lane, head, base[..., torch.arange(lane.draft_vocab_size, device=device) % n], anchor


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
    parser.add_argument("--spreads", type=float, nargs="+", default=[1.0],
                        help="the base logits' standard deviations")
    parser.add_argument("--rounds", default=None,
                        help="real rounds (testbed/certificate.py --rounds-out) in place of "
                             "random weights and base logits (see tiled_head)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    lane = lane_config(args.lane)
    gen = torch.Generator(device=device).manual_seed(0)
    head, d2t = random_head(lane, gen)
    if args.rounds:
        lane, head, real_base, real_anchor = tiled_head(lane, args.rounds, device)
        d2t, args.spreads = None, [0.0]
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
    norms = row_norms(head.markov_w2.weight)
    rows = []
    for R, sampled, spread in ((R, sampled, spread) for R in args.batches
                               for sampled in (False, True) for spread in args.spreads):
        inputs = dict(
            h=torch.zeros(R, k, lane.hidden_size, device=device, dtype=lane.torch_dtype),
            base_logits=torch.empty(R, k, V, device=device, dtype=lane.torch_dtype), state=None,
            anchor=torch.empty(R, dtype=torch.long, device=device),
            temperature=(torch.arange(R, device=device) % 2).float() * sampled,
            seed=torch.arange(R, device=device) + 7, anchor_pos=torch.full((R,), 4096,
                                                                          device=device))

        def fresh_round() -> None:
            if args.rounds:  # R saved rounds, drawn at random
                pick = torch.randint(0, len(real_base), (R,), generator=gen, device=device)
                inputs["base_logits"].copy_(real_base[pick])
                inputs["anchor"].copy_(real_anchor[pick])
                return
            inputs["base_logits"].normal_(std=spread, generator=gen)
            inputs["anchor"].random_(0, lane.target_vocab_size, generator=gen)

        trials = []  # (base logits, anchor, the eager loop's ids, the fused walk's)
        for _ in range(args.trials):
            fresh_round()
            ids = [markov_loop(loops[name], **inputs, keep_logits=False)[0]
                   for name in ("loop (eager)", "loop (fused)")]
            trials.append((inputs["base_logits"].clone(), inputs["anchor"].clone(), *ids))
        loop_bytes = (k * V * r + R * k * V) * size
        flops = 2 * R * k * r * V
        floor_ms = max(loop_bytes / ceilings.bandwidth, flops / ceilings.matmul) * 1e3

        def certified(base_logits: Tensor, anchor: Tensor, **_) -> tuple[Tensor, Tensor]:
            return markov.certified_markov_walk(
                head.markov_w1.weight, head.markov_w2.weight, norms, base_logits, anchor,
                inputs["temperature"], inputs["seed"], inputs["anchor_pos"], d2t)

        def walk(loop) -> Callable[..., tuple[Tensor, Optional[Tensor]]]:
            return lambda **kw: (markov_loop(loop, **kw, keep_logits=False)[0], None)
        timed = [("loop (eager)", walk(loops["loop (eager)"]), default)]
        timed += [(name, walk(loops["loop (fused)"]), shape) for name, shape in launches.items()]
        timed += [("loop (certified)", certified, default)]
        for name, run, shape in timed:
            markov.launch.launch_shape = shape
            differing, differing_fused, read = 0, 0, []
            try:
                for base_logits, anchor, ids, fused_ids in trials:
                    got, rows_read = run(**dict(inputs, base_logits=base_logits,
                                                anchor=anchor))
                    differing += int((got != ids).sum())
                    differing_fused += int((got != fused_ids).sum())
                    if rows_read is not None:
                        read.append(rows_read.sum().item() / (k * V))
            except OutOfResources as error:  # a launch too large for this GPU
                print(f"{lane.name:14s} {R:3d} {name:28s} {error}", flush=True)
                continue
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                run(**inputs)
            ms = replay_ms(graph)
            kernels_ms, kernels = kernels_per_replay(graph)
            temperature = "odd rows 1" if sampled else "0"
            rows.append(dict(lane=lane.name, batch=R, temperature=temperature, path=name,
                             base_std="real rounds" if args.rounds else spread,
                             w2_read=significant(statistics.mean(read)) if read else 1.0,
                             ms=significant(ms), floor_ms=significant(floor_ms),
                             vs_floor=significant(ms / floor_ms), floor_bytes=loop_bytes,
                             kernels_ms=significant(kernels_ms), kernels=kernels,
                             ids_compared=args.trials * R * k, ids_differing=differing,
                             ids_differing_from_fused=differing_fused))
            print(f"{lane.name:14s} {R:3d} T={temperature:10s} std {spread:4g} {name:18s} "
                  f"W2 read {rows[-1]['w2_read']:.4f} {ms:8.4f} ms  "
                  f"floor {floor_ms:.4f} ms  x{ms / floor_ms:.3f}  kernels {kernels_ms:.4f} ms "
                  f"({kernels:g})  ids differing {differing}/{args.trials * R * k} "
                  f"(from fused {differing_fused})", flush=True)
            del graph
        markov.launch.launch_shape = default
        with open(args.out, "w") as f:  # after every batch: a run cut short keeps its rows
            json.dump(dict(header, rows=rows), f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
