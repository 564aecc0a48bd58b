"""The benchmark tools of ``scripts/`` run as their docstrings say, each checked against
something it did not compute itself: the profiler's own operator names, the artifact's
size on disk, the eager loop's ids."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def run_script(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, str(SCRIPTS / name), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def test_profile_round_times_each_phase_and_lists_the_rounds_kernels(tmp_path, device):
    out = tmp_path / "phases.json"
    done = run_script("profile_round.py", "--lane", "tiny", "--backends", "eager",
                      "--batch", "2", "--device", device.type, "--root", str(tmp_path / "a"),
                      "--repeats", "3", "--top", "40", "--json", str(out), cwd=tmp_path)
    report = json.loads(out.read_text())
    assert report["batch"] == 2 and report["context"] <= 512  # the tiny lane's cache
    phases = report["ms"]["eager"]
    assert {"round", "check", "replay", "copy_in", "host_work"} <= set(phases)
    assert all(phases[p] > 0 for p in ("round", "replay", "copy_in"))
    # the profiler's own table of the round: the backbone's GEMMs are in it
    assert "aten::mm" in done.stdout or "gemm" in done.stdout.lower()


def test_artifact_times_reports_a_verified_artifact_of_its_size_on_disk(tmp_path, device):
    root, out = tmp_path / "artifacts", tmp_path / "cold.json"
    run_script("artifact_times.py", "--lane", "tiny", "--backends", "eager", "--buckets", "1",
               "--device", device.type, "--root", str(root), "--out", str(out), cwd=tmp_path)
    (result,) = json.loads(out.read_text())["results"]
    assert result["backend"] == "eager" and result["built"] and result["identical"]
    (artifact,) = [p.parent for p in root.rglob("manifest.json")]
    on_disk = sum(p.stat().st_size for p in artifact.iterdir()) / 1e6
    assert result["artifact_mb"] == pytest.approx(on_disk, abs=0.05)
    marks = list(result["marks"].values())
    assert marks == sorted(marks)  # phases from the spawn on, in the order they happen


def test_markov_loop_bench_drafts_the_eager_loops_ids(tmp_path, device):
    if device.type != "cuda":
        pytest.skip("the loop benchmark captures CUDA graphs and times the fused walk")
    out = tmp_path / "loop.json"
    run_script("markov_loop_bench.py", "--lane", "qwen36_35b_a3b", "--batches", "1", "8",
               "--trials", "2", "--out", str(out), cwd=tmp_path)
    rows = json.loads(out.read_text())["rows"]
    assert {r["path"] for r in rows} == {"loop (eager)", "loop (fused)"}
    assert {r["batch"] for r in rows} == {1, 8}
    assert all(r["ids_compared"] > 0 and r["ids_differing"] == 0 for r in rows)
