"""Seconds to bring a lane's weights file onto the GPU: safetensors' own loader against the
staged copy ``load_weights`` uses on CUDA, each in a fresh process with the file in the
page cache (as after an artifact's sha256 check), alternating, and the pinned copy alone.

    python scripts/weights_load_bench.py --lanes qwen36_35b_a3b qwen36_27b --repeats 2 \
        --out bench/results/cold_start_h200/weights_load.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

WRITE = """
import sys
from dspark_compile.checkpoint import random_drafter
from dspark_compile.compile.store import save_weights
from dspark_compile.config import lane_config
from pathlib import Path
drafter = random_drafter(lane_config(sys.argv[1]), "cuda", seed=0)
save_weights(drafter.state_dict(), Path(sys.argv[2]))
"""

TIME = """
import json, os, sys, time
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from dspark_compile.checkpoint.staging import read_tensors
path, how = sys.argv[1], sys.argv[2]
torch.cuda.init(); torch.empty(1, device="cuda")
with safe_open(path, "pt") as f:
    names = list(f.keys())
start = time.perf_counter()
if how == "safetensors":
    tensors = load_file(path, device="cuda")
elif how == "staged":
    tensors = read_tensors(path, torch.device("cuda"), names)
else:  # the host-to-device copy alone, from pinned memory: the floor once the file is read
    size = os.path.getsize(path)
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    start = time.perf_counter()
    tensors = {"all": host.to("cuda", non_blocking=True)}
torch.cuda.synchronize()
seconds = time.perf_counter() - start
print(json.dumps(dict(how=how, seconds=seconds,
                      gb=sum(t.numel() * t.element_size() for t in tensors.values()) / 1e9)))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lanes", nargs="+", default=["qwen36_35b_a3b", "qwen36_27b"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for lane in args.lanes:
            folder = Path(tmp) / lane
            folder.mkdir()
            subprocess.run([sys.executable, "-c", WRITE, lane, str(folder)], check=True)
            path = str(next(folder.iterdir()))
            for _ in range(args.repeats):
                for how in ("safetensors", "staged", "pinned copy"):
                    out = subprocess.run([sys.executable, "-c", TIME, path, how], check=True,
                                         capture_output=True, text=True).stdout
                    row = dict(lane=lane, **json.loads(out.strip().splitlines()[-1]))
                    row["gb_per_s"] = round(row["gb"] / row["seconds"], 2)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    Path(args.out).write_text(json.dumps(dict(command=" ".join(["python", *sys.argv]),
                                              rows=rows), indent=2) + "\n")


if __name__ == "__main__":
    main()
