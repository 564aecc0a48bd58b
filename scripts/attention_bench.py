"""The block's attention alone against its floor: every layer of one draft round, as the
fused kernel (``dspark::block_attention``) and as SDPA with the dense mask, each captured
in one CUDA graph, at a lane's shapes.

    python scripts/attention_bench.py --lanes qwen36_27b qwen36_35b_a3b --batches 1 8 64 \
        --context 4096 --out attention.json
    python scripts/attention_bench.py ... --launch 512x32x64x8x2  # chunk x block_m x
    # block_n x warps x stages, besides the op's own launch

Random bf16 queries and caches; every request's block at ``--context``. The floor is the
keys and values each layer must read (the visible ones: the window of a sliding layer)
plus the queries and outputs, over the copy bandwidth measured in the same run. Each
launch's output is compared with SDPA's in float32 (largest difference), and request 0
drafted alone must give the batch's bits.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch

from markov_loop_bench import replay_ms
from dspark_compile.compile.key import environment
from dspark_compile.config import LaneConfig, lane_config
from dspark_compile.kernels import attention
from dspark_compile.model.backbone import grouped_sdpa
from dspark_compile.model.masks import Span, attention_masks
from dspark_compile.tools.bench import significant
from dspark_compile.tools.roofline import measure_ceilings


def captured(fn) -> torch.cuda.CUDAGraph:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def parse_launch(text: str) -> attention.Launch:
    chunk, block_m, block_n, warps, stages = map(int, text.split("x"))
    return attention.Launch(chunk, block_m, block_n, warps, stages)


def bench_lane(lane: LaneConfig, batch: int, context: int, launches: dict, bandwidth: float,
               gen: torch.Generator) -> list[dict]:
    n, D, L = lane.block_rows, lane.head_dim, lane.num_layers
    slots = lane.max_context + n + 1
    q = torch.randn(batch, n, lane.num_heads, D, generator=gen, device="cuda").bfloat16()
    k, v = (torch.randn(batch, L, lane.num_kv_heads, slots, D, generator=gen,
                        device="cuda").bfloat16() for _ in "kv")
    anchor_pos = torch.full((batch,), context, device="cuda")
    spans = attention_masks(lane, anchor_pos, slots)
    dense = attention_masks(lane.replace(fused_attention=False), anchor_pos.cpu(), slots)
    dense = {kind: mask.cuda() for kind, mask in dense.items()}
    kinds = [lane.layer_type(i) for i in range(L)]
    keys = [min(context, lane.sliding_window) + n if kind == "sliding_attention"
            else context + n for kind in kinds]
    size = 2  # bf16
    floor_bytes = sum(2 * batch * lane.num_kv_heads * keys_ * D * size + 2 * q.numel() * size
                      for keys_ in keys)
    floor_ms = floor_bytes / bandwidth * 1e3
    scale = D ** -0.5
    reference = [grouped_sdpa(q.float(), k[:, i].float(), v[:, i].float(), dense[kind], scale)
                 for i, kind in enumerate(kinds)]
    rows = []

    def fused_call(i: int, span: Span, r: slice = slice(None)) -> torch.Tensor:
        return attention.block_attention(q[r], k[r, i], v[r, i], span.anchor_pos[r],
                                         span.window, span.causal, scale)

    default = attention.launch_shape
    for name, launch in launches.items():
        attention.launch_shape = default if launch is None else (lambda *_, s=launch: s)
        try:
            outs = [fused_call(i, spans[kind]) for i, kind in enumerate(kinds)]
            error = max((o.float() - ref).abs().max().item() for o, ref in zip(outs, reference))
            alone = all(torch.equal(fused_call(i, spans[kind], slice(0, 1)), outs[i][:1])
                        for i, kind in enumerate(kinds))
            graph = captured(lambda: [fused_call(i, spans[kind]) for i, kind in enumerate(kinds)])
            ms = replay_ms(graph, replays=20, repeats=7)
        finally:
            attention.launch_shape = default
        shape = default(lane.num_heads // lane.num_kv_heads * n, D) if launch is None else launch
        rows.append(dict(lane=lane.name, batch=batch, context=context, path="fused",
                         launch=name, shape=dataclasses.asdict(shape), ms=significant(ms),
                         floor_ms=significant(floor_ms), over_floor=significant(ms / floor_ms),
                         max_abs_error=error, alone_identical=alone))
    graph = captured(lambda: [grouped_sdpa(q, k[:, i], v[:, i], dense[kind], scale)
                              for i, kind in enumerate(kinds)])
    ms = replay_ms(graph, replays=20, repeats=7)
    rows.append(dict(lane=lane.name, batch=batch, context=context, path="sdpa", launch="",
                     ms=significant(ms), floor_ms=significant(floor_ms),
                     over_floor=significant(ms / floor_ms)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lanes", nargs="+", default=["qwen36_27b", "qwen36_35b_a3b"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64])
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--launch", nargs="*", default=[],
                        help="chunk x block_m x block_n x warps x stages")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    ceilings = measure_ceilings(torch.device("cuda"), torch.bfloat16)
    launches = {"default": None, **{text: parse_launch(text) for text in args.launch}}
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for name in args.lanes:
        for batch in args.batches:
            for row in bench_lane(lane_config(name).for_device("cuda"), batch, args.context,
                                  launches, ceilings.bandwidth, gen):
                rows.append(row)
                print(f"{row['lane']:15} {row['batch']:3} {row['path']:6} {row['launch']:18} "
                      f"{row['ms']:8.4f} ms  floor {row['floor_ms']:8.4f}  "
                      f"x{row['over_floor']:5.2f}  err {row.get('max_abs_error', '')} "
                      f"alone {row.get('alone_identical', '')}", flush=True)
    Path(args.out).write_text(json.dumps(dict(bandwidth=ceilings.bandwidth, rows=rows,
                                              env=environment("cuda")), indent=2) + "\n")


if __name__ == "__main__":
    main()
