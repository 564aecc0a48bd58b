"""Hydra entry points: ``dspark-compile``, ``dspark-verify``, ``dspark-bench`` and
``dspark-sweep``."""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import hydra
import torch
from omegaconf import DictConfig

from dspark_compile.artifacts import build_artifact
from dspark_compile.checkpoint import describe_sources, load_checkpoint, random_drafter
from dspark_compile.bench import run_bench, timed, write
from dspark_compile.commands import (BenchConfig, Config, VerifyConfig, register_configs,
                                     to_config)
from dspark_compile.config import CONF_DIR
from dspark_compile.draft import KVCache, draft
from dspark_compile.errors import DSparkError
from dspark_compile.model import Drafter
from dspark_compile.reference import HostPath
from dspark_compile.rounds import synthetic_rounds
from dspark_compile.runtime import Runner, load_runner
from dspark_compile.verify import verify_artifact

register_configs()


def build_drafter(cfg: Config | BenchConfig) -> Drafter:
    if cfg.checkpoint:
        drafter = load_checkpoint(cfg.checkpoint, cfg.lane, cfg.device, cfg.verifier)
        print(f"checkpoint {cfg.checkpoint}: {describe_sources(drafter.sources)}", flush=True)
        return drafter
    return random_drafter(cfg.lane, cfg.device, cfg.seed)


def compare_paths(cfg: Config, runner: Runner) -> list[dict[str, object]]:
    """Seeded rounds through the host path, the eager device path and the artifact's
    runtime; one row per path. All three run the runner's bucket-sized batch."""
    device, lane = runner.device, runner.lane
    slots = [runner.admit() for _ in range(cfg.batch)]
    bucket = runner.bucket(cfg.batch)
    eager_cache, host_cache = (KVCache.allocate(lane, bucket, device) for _ in "eh")
    host = HostPath(runner.drafter)
    ms: dict[str, list[float]] = {"host": [], "eager": [], "runtime": []}
    identical = {"eager": True, "runtime": True}
    for inputs in synthetic_rounds(lane, cfg.batch, cfg.context, cfg.rounds, cfg.seed, device):
        full, rows = runner.layout(inputs, slots)
        ref, t = timed(lambda: host.draft(host_cache, full), device)
        ms["host"].append(t)
        out, t = timed(lambda: draft(runner.drafter, eager_cache, full), device)
        ms["eager"].append(t)
        identical["eager"] &= torch.equal(out.ids.cpu(), ref.ids)
        identical["eager"] &= torch.equal(out.confidences.cpu(), ref.confidences)
        out, t = timed(lambda: runner.draft(inputs, slots), device)
        ms["runtime"].append(t)
        identical["runtime"] &= torch.equal(out.ids.cpu(), ref.ids[rows.cpu()])
    # round 0 carries the prompt; the rounds after it are the steady state
    steady = slice(1, None) if cfg.rounds > 1 else slice(None)
    device_bytes = cfg.batch * lane.k * (8 + 4)
    backend = runner.manifest["backend"]
    table = [("host", f"host ({bucket} rows)", "reference", ref.transfers.d2h_bytes),
             ("eager", "device (eager)", identical["eager"], device_bytes),
             ("runtime", f"runtime ({backend})", identical["runtime"], device_bytes)]
    return [dict(lane=lane.name, batch=cfg.batch, path=path, identical=same, d2h_bytes=size,
                 ms=statistics.median(ms[key][steady])) for key, path, same, size in table]


def print_table(rows: list[dict[str, object]]) -> None:
    header = list(rows[0])
    cells = [[f"{r[h]:.3f}" if isinstance(r[h], float) else str(r[h]) for h in header]
             for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(header)]
    for line in [header, *cells]:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip())


def command(name: str, config_name: str, needs: tuple[str, str] | None = None
            ) -> Callable[[Callable[[DictConfig], None]], Callable[[], None]]:
    """A Hydra entry point whose typed errors end the process with status 2 and one line,
    ``<name>: <ErrorType>: <message>``; ``--debug`` (or ``HYDRA_FULL_ERROR=1``) shows the
    traceback instead. ``needs``: a module the command cannot start without, and the
    install command that brings it."""
    def wrap(body: Callable[[DictConfig], None]) -> Callable[[], None]:
        @hydra.main(config_path=str(CONF_DIR), config_name=config_name, version_base="1.3")
        def task(cfg: DictConfig) -> None:
            try:
                body(cfg)
            except DSparkError as err:
                if os.environ.get("HYDRA_FULL_ERROR") == "1":
                    raise
                print(f"{name}: {type(err).__name__}: {err}", file=sys.stderr)
                raise SystemExit(2) from None

        def main() -> None:
            if needs and importlib.util.find_spec(needs[0]) is None:
                print(f"{name}: MissingBackendError: {name} needs {needs[0]}: {needs[1]}",
                      file=sys.stderr)
                raise SystemExit(2)
            if "--debug" in sys.argv:
                sys.argv.remove("--debug")
                os.environ["HYDRA_FULL_ERROR"] = "1"
            task()
        return main
    return wrap


@command("dspark-compile", "config")
def compile_main(cfg: DictConfig) -> None:
    config: Config = to_config(cfg)
    backend, buckets = config.backend.name, config.buckets
    print(f"lane {config.lane.name}, backend {backend}, buckets {buckets}, "
          f"device {config.device}", flush=True)
    drafter = build_drafter(config)
    print(f"compiling the draft step (or finding it under {config.artifacts_dir}/) ...",
          flush=True)
    (path, built), seconds = timed(
        lambda: build_artifact(drafter, backend, buckets, config.artifacts_dir),
        torch.device(config.device))
    print(f"{'built' if built else 'reused'} {path} in {seconds / 1e3:.1f} s", flush=True)
    print("verifying in a fresh process ...", flush=True)
    check = subprocess.run([sys.executable, "-m", "dspark_compile.verify", f"artifact={path}",
                            f"device={config.device}"], capture_output=True, text=True)
    print(check.stdout.strip() or check.stderr.strip())
    if check.returncode:
        raise SystemExit(f"dspark-verify failed for {path}")
    rows = compare_paths(config, load_runner(path, config.device))
    print_table(rows)
    if not all(r["identical"] in (True, "reference") for r in rows):
        raise SystemExit("a path disagrees with the host path")
    print(path)


@command("dspark-verify", "verify")
def verify_main(cfg: DictConfig) -> None:
    """One JSON line, also when the artifact cannot be checked (then with its error)."""
    try:
        config: VerifyConfig = to_config(cfg)
        report = verify_artifact(config.artifact, config.device, config.rounds,
                                 config.context, config.seed, config.temperature)
    except DSparkError as err:
        print(json.dumps({"identical": False, "error": f"{type(err).__name__}: {err}"}))
        raise
    print(json.dumps(report))
    if not report["identical"]:
        raise SystemExit(1)


@command("dspark-bench", "bench")
def bench_main(cfg: DictConfig) -> None:
    bench(to_config(cfg))


def bench(config: BenchConfig) -> Path:
    """Run one benchmark, print its table, write its JSON and PNG; returns the JSON path."""
    print(f"lane {config.lane.name}, backends {config.backends}, buckets {config.buckets}, "
          f"context {config.context}, device {config.device}", flush=True)
    result = run_bench(build_drafter(config), config.backends, config.buckets, config.context,
                       config.artifacts_dir, config.repeats, config.warmup, config.seed)
    bandwidth, matmul = result["ceilings"]["bandwidth"], result["ceilings"]["matmul"]
    print(f"measured now: copy {bandwidth / 1e9:.3g} GB/s, matmul {matmul / 1e12:.3g} TFLOP/s"
          + (" (on the CPU, caches make the floor indicative only)"
             if config.device == "cpu" else ""))
    print_table([{k: r[k] for k in ("lane", "batch", "path", "ms", "vs_host", "floor_ms",
                                    "vs_floor", "d2h_bytes", "graphs", "kernels",
                                    "identical", "near_ties")}
                 for r in result["rows"]])
    stem = f"bench_{config.lane.name}_{result['env']['device_type']}"
    json_path, png_path = write(result, config.out_dir, stem)
    print(json_path)
    print(png_path)
    return json_path


@command("dspark-sweep", "sweep", needs=("hydra_plugins.hydra_joblib_launcher",
                                         "pip install 'dspark-compile[sweep]'"))
def sweep_main(cfg: DictConfig) -> None:
    from dspark_compile.sweep import run_job

    run_job(cfg)
