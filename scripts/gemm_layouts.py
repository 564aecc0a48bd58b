"""The round's GEMMs against their bytes, in three weight layouts and two compilers: each
projection of a decode round timed alone (the lane's five layers' weights in turn, in one
CUDA graph), at the shapes the runtime gives it, against the time its weights take to
read at the copy bandwidth measured in the same run.

Layouts, per layer: ``split`` (as the model holds them: context K and V, block Q, K, V, O,
gate, up, down: 9 GEMMs), ``fused`` (Q|K|V one weight, gate|up one: the context's K|V,
the block's Q|K|V, O, gate|up, down: 5) and ``folded`` (the context rows and the block's
rows through one Q|K|V GEMM: 4). Compilers: eager (cuBLAS) and Inductor's max-autotune
(its Triton templates among cuBLAS), each call captured in a CUDA graph.

    python scripts/gemm_layouts.py --lanes qwen36_35b_a3b qwen36_27b --batches 1 8 64 \
        --max-autotune --json gemms.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor

from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import lane_config
from dspark_compile.tools.roofline import measure_ceilings
from dspark_compile.tools.timing import time_ms


def layer_weights(drafter) -> list[dict[str, Tensor]]:
    """Each layer's weights in every layout's form (views of the model's fused weights)."""
    out = []
    for layer in drafter.layers:
        a, m = layer.self_attn, layer.mlp
        q, k, v = a.qkv_proj.weight.split(a.sizes)
        gate, up = m.gate_up_proj.weight.chunk(2)
        out.append({"q": q, "k": k, "v": v, "o": a.o_proj.weight, "gate": gate, "up": up,
                    "down": m.down_proj.weight, "kv": a.qkv_proj.rows("k_proj")[0],
                    "qkv": a.qkv_proj.weight, "gate_up": m.gate_up_proj.weight})
    return out


def projections(lane, batch: int) -> dict[str, list[tuple[str, str, int]]]:
    """Per layout, the round's GEMMs of one layer: (name, weight, input rows)."""
    block, ctx = batch * lane.block_rows, batch * (lane.k + 1)
    tail = [("o", "o", block), ("gate_up", "gate_up", block), ("down", "down", block)]
    return {
        "split": [("ctx k", "k", ctx), ("ctx v", "v", ctx), ("q", "q", block), ("k", "k", block),
                  ("v", "v", block), ("o", "o", block), ("gate", "gate", block),
                  ("up", "up", block), ("down", "down", block)],
        "fused": [("ctx kv", "kv", ctx), ("qkv", "qkv", block), *tail],
        "folded": [("ctx+block qkv", "qkv", ctx + block), *tail],
    }


def graphed(fn: Callable[[], object]) -> Callable[[], None]:
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def time_gemm(weights: list[Tensor], rows: int, mm: Callable, repeats: int) -> float:
    """us per GEMM over the layers' weights in turn, in one CUDA graph."""
    x = torch.randn(rows, weights[0].shape[1], device=weights[0].device,
                    dtype=weights[0].dtype)
    replay = graphed(lambda: [mm(x, w) for w in weights])
    return time_ms(replay, x.device, repeats, warmup=3) * 1e3 / len(weights)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lanes", nargs="+", default=["qwen36_35b_a3b"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--max-autotune", action="store_true")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    device = torch.device("cuda")
    compilers = {"eager": lambda x, w: x @ w.T}
    if args.max_autotune:
        compilers["max-autotune"] = torch.compile(
            lambda x, w: x @ w.T, dynamic=False, mode="max-autotune-no-cudagraphs")
    results = []
    for name in args.lanes:
        lane = lane_config(name)
        drafter = random_drafter(lane, device, seed=0)
        ceilings = measure_ceilings(device, lane.torch_dtype)
        weights = layer_weights(drafter)
        for batch in args.batches:
            for layout, gemms in projections(lane, batch).items():
                for compiler, mm in compilers.items():
                    total_us = floor_us = 0.0
                    for gemm, key, rows in gemms:
                        ws = [w[key] for w in weights]
                        us = time_gemm(ws, rows, mm, args.repeats)
                        nbytes = ws[0].numel() * ws[0].element_size()
                        floor = nbytes / ceilings.bandwidth * 1e6
                        total_us, floor_us = total_us + us, floor_us + floor
                        results.append({"lane": name, "batch": batch, "layout": layout,
                                        "compiler": compiler, "gemm": gemm, "rows": rows,
                                        "shape": list(ws[0].shape), "us": us,
                                        "floor_us": floor})
                        print(f"{name} b{batch} {layout:6} {compiler:12} {gemm:14} rows {rows:4}"
                              f" {str(list(ws[0].shape)):14} {us:8.2f} us  x{us / floor:.2f}",
                              flush=True)
                    print(f"{name} b{batch} {layout:6} {compiler:12} LAYER {total_us:8.2f} us"
                          f"  floor {floor_us:.2f}  x{total_us / floor_us:.2f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
