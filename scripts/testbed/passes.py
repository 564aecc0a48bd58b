"""The target's pass time by tokens per pass (``llama.StaticLlama``, one CUDA graph each):
what a verification pass of k + 1 tokens costs against a decoding pass of one, in fp32
(cuBLAS and cuBLASLt) and bf16. The
speed-up of speculative decoding is bounded by tokens per round x (1-token pass) /
(verification pass + draft round). ``--profile`` writes the kernels of each fp32 pass at
batch 1, by total time.

    python scripts/testbed/passes.py --target testbed/target --profile bench_out/passes
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from llama import StaticLlama, captured
from target import load_target

VARIANTS = [("float32", "cublas"), ("float32", "cublaslt"), ("bfloat16", "cublas")]


def timed(run, tokens, start, repeats: int) -> float:
    """Milliseconds a replay, by CUDA events."""
    for _ in range(10):
        run(tokens, start)
    begin, end = torch.cuda.Event(True), torch.cuda.Event(True)
    begin.record()
    for _ in range(repeats):
        run(tokens, start)
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / repeats


def kernels(llama: StaticLlama, tokens, start, path: Path) -> None:
    """The eager pass's kernels by total device time (10 passes), as a table."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            llama.forward(tokens, start)
        torch.cuda.synchronize()
    path.write_text(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25,
                                              max_name_column_width=90))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="testbed/target")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--tokens", nargs="+", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--slots", type=int, default=400, help="the cache (e2e: ~380)")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--profile", type=Path, default=None, help="a folder for the tables")
    args = parser.parse_args()
    for dtype, blas in VARIANTS:
        torch.backends.cuda.preferred_blas_library(blas)
        model = load_target(args.target, "cuda", getattr(torch, dtype))
        for batch in args.batches:
            for n in args.tokens:
                llama = StaticLlama(model, batch, args.slots, [1, 15, 28])
                tokens = torch.randint(0, 49152, (batch, n), device="cuda")
                start = torch.full((batch,), 300, device="cuda")
                ms = timed(captured(llama, batch, n), tokens, start, args.repeats)
                print(json.dumps(dict(dtype=dtype, blas=blas, batch=batch,
                                      tokens=n, ms=ms)), flush=True)
                if args.profile and batch == 1 and n in (1, max(args.tokens)):
                    args.profile.mkdir(parents=True, exist_ok=True)
                    kernels(llama, tokens, start,
                            args.profile / f"{dtype}_{blas}_{n}.txt")


if __name__ == "__main__":
    main()
