"""One job of ``dspark-sweep``: a benchmark in a fresh process, its rows appended to the
sweep's results table (``results.csv`` and ``results.jsonl`` in the sweep directory).

A job that fails (an exception, a crashed compiler, a segfault) leaves one row that says
so, and the sweep goes on.
"""

from __future__ import annotations

import csv
import json
import math
import multiprocessing
import traceback
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from dspark_compile.compile.store import locked
from dspark_compile.errors import DSparkError
from dspark_compile.tools.bench import bench
from dspark_compile.tools.commands import BenchConfig, to_config

TABLE = "results"
COLUMNS = ["job", "status", "error", "lane", "context", "batch", "path", "ms", "vs_host",
           "floor_ms", "vs_floor", "d2h_bytes", "graphs", "kernels", "identical", "near_ties"]


def run_job(cfg: DictConfig) -> None:
    """One job: its config checked (a refused one is a failed row), then the benchmark."""
    hydra = HydraConfig.get()
    job_dir = Path(hydra.runtime.output_dir)
    sweep_dir = Path(hydra.sweep.dir)
    key = hydra.job.override_dirname or "defaults"
    overrides = dict(o.split("=", 1) for o in hydra.overrides.task)
    try:
        config: BenchConfig = to_config(cfg)
    except DSparkError as err:
        error = f"{type(err).__name__}: {err}"
    else:
        config.out_dir = str(job_dir)
        error = _bench_in_fresh_process(config, job_dir)
    if error is None:
        result = json.loads(next(job_dir.glob("bench_*.json")).read_text())
        rows = [dict(job=key, status="ok", error="", context=result["context"], **row)
                for row in result["rows"]]
    else:
        rows = [dict(job=key, status="failed", error=error, lane=cfg.lane.name,
                     context=cfg.context)]
    done, failed = append(sweep_dir, [dict(row, overrides=overrides) for row in rows])
    print(progress(done, failed, total_jobs(sweep_dir)), flush=True)


def _bench_in_fresh_process(config: BenchConfig, job_dir: Path) -> str | None:
    """Run the benchmark in a spawned interpreter, so no compiler state, CUDA context or
    crash crosses jobs. Returns None, or the error in one line."""
    job_dir.mkdir(parents=True, exist_ok=True)
    process = multiprocessing.get_context("spawn").Process(
        target=_bench_process, args=(config, str(job_dir)))
    process.start()
    process.join()
    if process.exitcode == 0:
        return None
    error_file = job_dir / "error.txt"
    if error_file.is_file():
        return error_file.read_text().strip().splitlines()[-1]
    return f"the benchmark process died with exit code {process.exitcode}"


def _bench_process(config: BenchConfig, job_dir: str) -> None:
    try:
        bench(config)
    except BaseException:
        (Path(job_dir) / "error.txt").write_text(traceback.format_exc())
        raise


def append(sweep_dir: Path, rows: list[dict]) -> tuple[int, int]:
    """Append rows to the table (jobs may finish at once); returns (jobs done, failed)."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    jsonl, csv_path = sweep_dir / f"{TABLE}.jsonl", sweep_dir / f"{TABLE}.csv"
    with locked(sweep_dir / f"{TABLE}.lock"):
        with open(jsonl, "a") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        new = not csv_path.is_file()
        with open(csv_path, "a", newline="") as f:
            writer = csv.DictWriter(f, COLUMNS, extrasaction="ignore")
            if new:
                writer.writeheader()
            writer.writerows(rows)
        table = [json.loads(line) for line in jsonl.read_text().splitlines()]
    jobs = {row["job"]: row["status"] for row in table}
    return len(jobs), sum(status == "failed" for status in jobs.values())


def total_jobs(sweep_dir: Path) -> int | None:
    """Jobs in the sweep: the product of its swept choices, from the ``multirun.yaml`` that
    Hydra's sweeper writes first (the preset's ``hydra.sweeper.params``, then the command
    line, which wins for a key in both). None when that file is not there."""
    path = sweep_dir / "multirun.yaml"
    if not path.is_file():
        return None
    hydra = OmegaConf.load(path).hydra
    swept = {f"{key}={value}" for key, value in (hydra.sweeper.params or {}).items()}
    parsed = OverridesParser.create().parse_overrides([*swept, *hydra.overrides.task])
    choices = {o.key_or_group: len(list(o.sweep_string_iterator())) if o.is_sweep_override()
               else 1 for o in parsed}
    return math.prod(choices.values())


def progress(done: int, failed: int, total: int | None, width: int = 30) -> str:
    if total is None:
        return f"sweep: {done} jobs done ({failed} failed)"
    filled = width * min(done, total) // total
    return (f"sweep: [{'#' * filled}{'.' * (width - filled)}] {done}/{total} jobs "
            f"({failed} failed)")
