"""Attention of one draft block over the cache: cuDNN/SDPA (masked, what the backbone does)
against FlexAttention (compiled; decode kernel with split KV), per lane and batch.

python diag/attn_bench.py --lanes qwen36_27b qwen36_35b_a3b --batches 1 8 64 --out x.json
"""
import argparse
import json
import types

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from dspark_compile.config import lane_config
from dspark_compile.model.backbone import Backbone

torch._dynamo.config.cache_size_limit = 512
torch._dynamo.config.accumulated_cache_size_limit = 4096
flex_c = torch.compile(flex_attention, dynamic=False)


def graph_ms(fn, reps=20, inner=5):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(inner):
            fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / inner)
    times.sort()
    return times[len(times) // 2]


def cpu_ms(fn, reps=3):
    import time
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps * 1e3


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lanes", nargs="+", default=["qwen36_27b", "qwen36_35b_a3b"])
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64])
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out")
    a = p.parse_args()
    dev = torch.device(a.device)
    rows = []
    for name in a.lanes:
        lane = lane_config(name)
        n, kvh, D = lane.block_rows, lane.num_kv_heads, lane.head_dim
        group = lane.num_heads // kvh
        S = lane.max_context + n + 1
        bb = types.SimpleNamespace(lane=lane)
        for R in a.batches:
            g = torch.Generator(device=dev).manual_seed(R)
            kc = torch.randn(R, 2, kvh, S, D, generator=g, device=dev).to(torch.bfloat16)
            vc = torch.randn(R, 2, kvh, S, D, generator=g, device=dev).to(torch.bfloat16)
            q = torch.randn(R, kvh, group * n, D, generator=g, device=dev).to(torch.bfloat16)
            anchor_pos = torch.full((R,), a.context + lane.k + 1, device=dev)
            anchor_pos -= torch.arange(R, device=dev) * 7  # rows differ
            mask = Backbone.block_mask(bb, anchor_pos, S)
            k, v = kc[:, 1], vc[:, 1]
            scale = D ** -0.5

            def sdpa():
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)

            def mask_mod(b, h, qi, kv):
                start = anchor_pos[b]
                i = qi % n
                vis = kv < start + n
                if lane.block_causal:
                    vis = vis & ((kv < start) | (kv <= start + i))
                if lane.sliding_window is not None:
                    vis = vis & (start + i - kv < lane.sliding_window)
                return vis

            bm = create_block_mask(mask_mod, R, None, group * n, S, device=dev)

            def flex():
                return flex_c(q, k, v, block_mask=bm, scale=scale)

            def flex_mask():  # the block mask rebuilt per call, as a round would
                b2 = create_block_mask(mask_mod, R, None, group * n, S, device=dev, _compile=True)
                return flex_c(q, k, v, block_mask=b2, scale=scale)

            @torch.compile(dynamic=False)
            def inside(q, k, v):  # flex among other ops in one graph: same bits?
                q2 = (q.float() * 1.0).to(q.dtype)
                o = flex_attention(q2, k, v, block_mask=bm, scale=scale)
                return o * 2

            ref = sdpa()
            out = flex()
            in_graph = inside(q, k, v) / 2 if dev.type == 'cuda' else out
            extra = {}
            if dev.type == "cuda":
                for bm_ in (16, 32, 64):
                    for bn in (32, 64):
                        opts = dict(BLOCK_M=bm_, BLOCK_N=bn)
                        try:
                            o2 = flex_c(q, k, v, block_mask=bm, scale=scale, kernel_options=opts)
                            t = graph_ms(lambda: flex_c(q, k, v, block_mask=bm, scale=scale,
                                                        kernel_options=opts))
                            extra[f"flex_M{bm_}_N{bn}_ms"] = t
                            extra[f"flex_M{bm_}_N{bn}_differ_vs_default"] = int((o2 != out).sum())
                        except Exception as e:  # noqa: BLE001
                            extra[f"flex_M{bm_}_N{bn}_error"] = str(e)[:200]
            row = dict(lane=name, batch=R, **extra,
                       flex_vs_sdpa_maxabs=float((out.float() - ref.float()).abs().max()),
                       flex_vs_sdpa_differ=int((out != ref).sum()), numel=out.numel(),
                       flex_standalone_vs_in_graph_differ=int((out != in_graph).sum()))
            if dev.type == "cuda":
                row.update(sdpa_ms=graph_ms(sdpa), flex_ms=graph_ms(flex),
                           flex_with_mask_ms=graph_ms(flex_mask))
            else:
                row.update(sdpa_ms=cpu_ms(sdpa), flex_ms=cpu_ms(flex))
            print(row, flush=True)
            rows.append(row)
    if a.out:
        json.dump(dict(torch=torch.__version__, rows=rows), open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
