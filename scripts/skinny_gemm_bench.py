"""The skinny GEMM against cuBLAS at a lane's decode shapes: each GEMM of a round (the
context's K|V, Q|K|V, o, gate|up, down, fc, lm_head) timed alone, over enough copies of its
weight to miss the L2 cache, in one CUDA graph, against the time its weight's bytes take
at the copy bandwidth of the same run. ``dspark.linear`` runs at its own launch (where it
applies: ``kernels.linear.launch_shape``) and at each ``--launch``, forced on every shape.
A split launch (``splits`` > 1) is timed as its partials' kernel alone: in a compiled
step their sum is fused into the output's consumer. The context append's GEMMs (ctx kv,
fc) are timed too, though the model keeps them on cuBLAS (a prefill's rows are a dynamic
size in ``aoti``'s export).

    python scripts/skinny_gemm_bench.py --lanes qwen36_27b qwen36_35b_a3b --batches 1 \
        --launch 128x3 128x5 256x3 256x5 --out skinny.json   # BLOCK_K x stages
    ... --launch 512x3x16x2        # BLOCK_K x stages x features x warps per program
    ... --launch 128x4x64x4x4      # ... x splits of K
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Callable, Optional

import torch
from torch import Tensor

from dspark_compile import kernels
from dspark_compile.compile.key import environment
from dspark_compile.config import LaneConfig, lane_config
from dspark_compile.kernels import linear
from dspark_compile.tools.roofline import measure_ceilings
from dspark_compile.tools.timing import time_ms


def shapes(lane: LaneConfig, batch: int) -> list[tuple[str, int, int, int]]:
    """(GEMM, rows, output features, K) of one decode round."""
    H, q, kv = lane.hidden_size, lane.num_heads * lane.head_dim, lane.num_kv_heads * lane.head_dim
    block, context = batch * lane.block_rows, batch * (lane.k + 1)
    return [("ctx kv", context, 2 * kv, H), ("qkv", block, q + 2 * kv, H), ("o", block, H, q),
            ("gate_up", block, 2 * lane.intermediate_size, H),
            ("down", block, H, lane.intermediate_size), ("fc", context, H, lane.feature_size),
            ("lm_head", batch * lane.k, lane.draft_vocab_size, H)]


def time_us(mm: Callable[[Tensor, Tensor], Tensor], x: Tensor, weights: list[Tensor]) -> float:
    """us per GEMM over the weights in turn, in one CUDA graph."""
    calls = lambda: [mm(x, w) for w in weights]  # noqa: E731
    calls()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    return time_ms(graph.replay, x.device, repeats=30, warmup=3) * 1e3 / len(weights)


def kernel(x: Tensor, w: Tensor) -> Tensor:
    """The op's kernel at the op's launch: a split launch's partials, unsummed."""
    split = linear.launch_shape(x.shape[0], w.shape[0], x.shape[1],
                                linear.multiprocessors(x.device)).splits > 1
    return (torch.ops.dspark.linear_partials(x, w) if split
            else torch.ops.dspark.linear(x, w, None))


def forced(launch: linear.Launch) -> Callable[[Tensor, Tensor], Tensor]:
    def mm(x: Tensor, w: Tensor) -> Tensor:
        default, linear.launch_shape = linear.launch_shape, lambda *_: launch
        try:
            return kernel(x, w)
        finally:
            linear.launch_shape = default
    return mm


def launch_name(launch: linear.Launch) -> str:
    return f"{launch.block_k}x{launch.stages}x{launch.features}x{launch.warps}x{launch.splits}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lanes", nargs="+", default=["qwen36_27b", "qwen36_35b_a3b"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1])
    parser.add_argument("--launch", nargs="*", default=[],
                        help="BLOCK_KxSTAGES[xFEATURESxWARPS[xSPLITS]], e.g. 256x5, "
                             "128x4x64x4x4")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    sms = linear.multiprocessors(device)
    kernels.register()
    ceilings = measure_ceilings(device, torch.bfloat16)
    launches = {name: forced(linear.Launch(*map(int, name.split("x")))) for name in args.launch}
    rows = []
    for lane in map(lane_config, args.lanes):
        for batch in args.batches:
            for gemm, M, N, K in shapes(lane, batch):
                nbytes = N * K * 2
                copies = max(4, min(40, math.ceil(3e8 / nbytes)))  # 300 MB: past the L2
                weights = [torch.randn(N, K, device=device, dtype=torch.bfloat16) * K ** -0.5
                           for _ in range(copies)]
                x = torch.randn(M, K, device=device, dtype=torch.bfloat16)
                own: Optional[linear.Launch] = linear.launch_shape(M, N, K, sms)
                us = {"cublas": time_us(lambda x, w: x @ w.T, x, weights)}
                if own is not None:
                    us["op"] = time_us(kernel, x, weights)
                us.update({name: time_us(mm, x, weights) for name, mm in launches.items()})
                floor = nbytes / ceilings.bandwidth * 1e6
                rows.append(dict(lane=lane.name, batch=batch, gemm=gemm, rows=M, features=N,
                                 K=K, floor_us=floor, launch=own and launch_name(own),
                                 us=us))
                print(f"{lane.name} b{batch} {gemm:8} {M:4} x {N:6} x {K:6} floor {floor:7.2f} "
                      + " ".join(f"{name} {t:7.2f} (x{t / floor:.2f})" for name, t in us.items()),
                      flush=True)
                del weights
    with open(args.out, "w") as f:
        json.dump(dict(env=environment(device), bandwidth=ceilings.bandwidth, sms=sms,
                       rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
