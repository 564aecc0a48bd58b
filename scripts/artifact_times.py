"""Cold-compile time vs a cold start from the artifact, per backend, each in a fresh process.

Every step gets empty Inductor and Triton cache directories, so "build" is a cold compile
and the load proves the artifact alone suffices. The cold start is timed from the moment
the process is spawned to the first round's ids on the host, in phases: interpreter and
``import torch``, ``import dspark_compile``, ``load_runner``'s own phases (manifest and
sha256, weights, the backend's load, warm-up and capture) and the first round. Its floor is
the artifact's bytes read from disk with the page cache dropped for them, in the same run.
Each artifact is then checked by dspark-verify.

    python scripts/artifact_times.py --lane tiny --backends eager inductor aoti onnx \
        --buckets 1 4 --device cpu --out cold.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUILD = """
import sys, time
from dspark_compile.compile import build_artifact
from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import lane_config
lane, backend, device, root, buckets = sys.argv[1:6]
drafter = random_drafter(lane_config(lane), device, seed=0)
start = time.perf_counter()
path, built = build_artifact(drafter, backend, [int(b) for b in buckets.split(",")], root)
print(path, built, time.perf_counter() - start)
"""

LOAD = """
import json, os, sys, time
spawned = float(os.environ["DSPARK_SPAWNED_AT"])
marks = {"interpreter": time.time() - spawned}
import torch
marks["import torch"] = time.time() - spawned
from dspark_compile.runtime import load_runner
from dspark_compile.tools.rounds import synthetic_rounds
marks["import dspark_compile"] = time.time() - spawned
runner = load_runner(sys.argv[1], sys.argv[2], [int(b) for b in sys.argv[3].split(",")])
marks["load_runner"] = time.time() - spawned
prompt = next(synthetic_rounds(runner.lane, 1, 24, 1, 0, sys.argv[2]))
runner.draft(prompt, [runner.admit()]).ids.tolist()
marks["first round"] = time.time() - spawned
print(json.dumps(dict(marks=marks, load_runner_phases=runner.load_seconds)))
"""


def uncached_read_seconds(directory: Path) -> float:
    """Seconds to read every file of ``directory`` with its pages dropped from the page
    cache first (``posix_fadvise(DONTNEED)``; dropped again after), as a cold load would."""
    files = [p for p in sorted(directory.iterdir()) if p.is_file()]

    def drop() -> None:
        for path in files:
            with open(path, "rb") as f:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    drop()
    start = time.perf_counter()
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while f.read(1 << 24):
                pass
    seconds = time.perf_counter() - start
    drop()
    return seconds


def run(code: list[str], cache_dir: str) -> str:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir,
               TRITON_CACHE_DIR=os.path.join(cache_dir, "triton"), PYTHONUNBUFFERED="1",
               DSPARK_SPAWNED_AT=repr(time.time()))
    result = subprocess.run([sys.executable, *code], capture_output=True, text=True, env=env)
    if result.returncode:
        # drop torch's glog-style warning lines ("W1130 12:00:00 ..."): keep the traceback
        errors = [line for line in result.stderr.splitlines() if not re.match(r"[WI]\d{4} ", line)]
        raise RuntimeError(f"{code[:2]} exited {result.returncode}:\n" + "\n".join(errors[-40:]))
    return result.stdout.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lane", default="tiny")
    parser.add_argument("--backends", nargs="+", default=["eager", "inductor", "aoti", "onnx"])
    parser.add_argument("--buckets", nargs="+", type=int, default=[1, 4])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--root", default=None, help="artifacts dir (default: a temp dir)")
    parser.add_argument("--out", required=True, help="JSON file to write")
    args = parser.parse_args()
    root = args.root or tempfile.mkdtemp(prefix="dspark-artifacts-")
    buckets = ",".join(map(str, args.buckets))
    results = []
    out = dict(command=" ".join([Path(sys.executable).name, *sys.argv]), lane=args.lane,
               device=args.device, results=results)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    for backend in args.backends:
        print(f"{backend}: building ...", flush=True)
        with tempfile.TemporaryDirectory() as cache:
            path, built, build_s = run(["-c", BUILD, args.lane, backend, args.device, root,
                                        buckets], cache).split()
        floor_s = uncached_read_seconds(Path(path))
        with tempfile.TemporaryDirectory() as cache:
            cold = json.loads(run(["-c", LOAD, path, args.device, buckets], cache))
        with tempfile.TemporaryDirectory() as cache:
            start = time.perf_counter()
            report = json.loads(run(["-m", "dspark_compile", "verify", f"artifact={path}",
                                     f"device={args.device}"], cache))
            verify_s = time.perf_counter() - start
        marks = {name: round(t, 3) for name, t in cold["marks"].items()}
        row = dict(backend=backend, buckets=args.buckets, built=built == "True",
                   build_s=round(float(build_s), 2), cold_start_s=marks["first round"],
                   floor_s=float(f"{floor_s:.3g}"), marks=marks,
                   load_runner_phases=cold["load_runner_phases"],
                   verify_s=round(verify_s, 2), identical=report["identical"],
                   near_ties=report["near_ties"], tokens_compared=report["tokens_compared"],
                   artifact_mb=round(sum(f.stat().st_size for f in Path(path).iterdir())
                                     / 2**20, 1))
        results.append(row)
        print(json.dumps(row), flush=True)
        # after each backend: a run cut short keeps what it measured
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    from dspark_compile.compile.key import environment

    out["env"] = environment(args.device)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"{'backend':10} {'build s':>8} {'cold s':>7} {'floor s':>8} {'verify':>8} {'MB':>8}")
    for r in results:
        print(f"{r['backend']:10} {r['build_s']:8.1f} {r['cold_start_s']:7.2f} "
              f"{r['floor_s']:8.2g} {'same' if r['identical'] else 'DIFFER':>8} "
              f"{r['artifact_mb']:8.1f}")
    if not all(r["identical"] for r in results):
        raise SystemExit("an artifact is not token-identical to the host path")


if __name__ == "__main__":
    main()
