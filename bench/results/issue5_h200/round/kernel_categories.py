"""GPU time of one round by kind of kernel, from the chrome traces profile_round.py wrote.

    python kernel_categories.py qwen36_27b_b1_*.json.gz
"""

import collections
import gzip
import json
import sys


def kind(name: str) -> str:
    if "nvjet" in name or "gemm" in name.lower() or "splitKreduce" in name:
        return "gemm"
    if "markov" in name:
        return "markov"
    if "flex" in name or "attention" in name.lower() or "fmha" in name.lower():
        return "attention"
    if "Memcpy" in name or "Memset" in name:
        return "memcpy"
    return "other"


for path in sys.argv[1:]:
    events = json.load(gzip.open(path))["traceEvents"]
    ms, count = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            ms[kind(e["name"])] += e["dur"] / 1e3
            count[kind(e["name"])] += 1
    parts = "  ".join(f"{k} {ms[k]:.3f} ms ({count[k]})" for k in sorted(ms))
    print(f"{path}: {parts}  total {sum(ms.values()):.3f} ms")
