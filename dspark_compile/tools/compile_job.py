"""``dspark-compile``: build (or find) the artifact of a lane and a backend, verify it in a
fresh process, and print the host path, the eager device path and the runtime side by side
on seeded rounds."""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

import torch

from dspark_compile.compile import build_artifact
from dspark_compile.runtime import Runner, load_runner
from dspark_compile.tools.commands import Config, make_drafter
from dspark_compile.tools.compare import EAGER, HOST, Comparison, runtime_path
from dspark_compile.tools.report import print_table
from dspark_compile.tools.rounds import synthetic_rounds
from dspark_compile.tools.timing import timed


def compile_job(config: Config) -> Path:
    """The main job; returns the artifact's directory. Exits non-zero if any path
    disagrees with the host path."""
    backend, buckets = config.backend.name, config.buckets
    print(f"lane {config.lane.name}, backend {backend}, buckets {buckets}, "
          f"device {config.device}", flush=True)
    drafter = make_drafter(config)
    print(f"compiling the draft step (or finding it under {config.artifacts_dir}/) ...",
          flush=True)
    (path, built), ms = timed(
        lambda: build_artifact(drafter, backend, buckets, config.artifacts_dir),
        torch.device(config.device))
    print(f"{'built' if built else 'reused'} {path} in {ms / 1e3:.1f} s", flush=True)
    print("verifying in a fresh process ...", flush=True)
    check = subprocess.run([sys.executable, "-m", "dspark_compile", "verify",
                            f"artifact={path}", f"device={config.device}"],
                           capture_output=True, text=True)
    print(check.stdout.strip() or check.stderr.strip())
    if check.returncode:
        raise SystemExit(f"dspark-verify failed for {path}")
    rows = compare_paths(config, load_runner(path, config.device))
    print_table(rows)
    if not all(r["identical"] for r in rows):
        raise SystemExit("a path disagrees with the host path")
    print(path)
    return path


def compare_paths(config: Config, runner: Runner) -> list[dict[str, object]]:
    """Seeded rounds through the host path, the eager device path and the artifact's
    runtime, on the runner's bucket-sized batch; one row per path."""
    backend = runner.manifest["backend"]
    comparison = Comparison(runner.drafter, config.batch, {backend: runner})
    ms: dict[str, list[float]] = {}
    for index, inputs in enumerate(synthetic_rounds(runner.lane, config.batch,
                                                    config.context, config.rounds,
                                                    config.seed, runner.device)):
        host = comparison.round(inputs, ms, round=index)
    comparison.release()
    # round 0 carries the prompt; the rounds after it are the steady state
    steady = slice(1, None) if config.rounds > 1 else slice(None)
    eager_bytes = config.batch * runner.lane.k * (8 + 4)  # int64 ids, float32 confidences
    table = [(HOST, f"host ({comparison.bucket} rows)", "reference", host.transfers.d2h_bytes),
             (EAGER, EAGER, comparison.agreement[EAGER].identical, eager_bytes),
             (runtime_path(backend), runtime_path(backend),
              comparison.agreement[runtime_path(backend)].identical,
              runner.download_bytes(config.batch))]
    return [dict(lane=runner.lane.name, batch=config.batch, path=path, identical=same,
                 d2h_bytes=size, ms=statistics.median(ms[name][steady]))
            for name, path, same, size in table]
