"""The target's pass time by tokens per pass (``llama.StaticLlama``, one CUDA graph each):
what a verification pass of k + 1 tokens costs against a decoding pass of one, in fp32
and bf16. The speed-up of speculative decoding is bounded by tokens per round x (1-token
pass) / (verification pass + draft round).

    python scripts/testbed/passes.py --target testbed/target
"""

from __future__ import annotations

import argparse
import json

import torch

from llama import StaticLlama, captured
from target import load_target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="testbed/target")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--tokens", nargs="+", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--slots", type=int, default=900)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        model = load_target(args.target, "cuda", dtype)
        for batch in args.batches:
            for n in args.tokens:
                llama = StaticLlama(model, batch, args.slots, [1, 15, 28])
                run = captured(llama, batch, n)
                tokens = torch.randint(0, 49152, (batch, n), device="cuda")
                start = torch.full((batch,), 300, device="cuda")
                for _ in range(10):
                    run(tokens, start)
                begin, end = torch.cuda.Event(True), torch.cuda.Event(True)
                begin.record()
                for _ in range(args.repeats):
                    run(tokens, start)
                end.record()
                torch.cuda.synchronize()
                rows.append(dict(dtype=str(dtype).split(".")[-1], batch=batch, tokens=n,
                                 ms=begin.elapsed_time(end) / args.repeats))
                print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main()
