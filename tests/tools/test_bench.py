import json
import subprocess
import sys

import pytest
import torch

from dspark_compile.tools.bench import run_bench
from dspark_compile.tools.report import write
from dspark_compile.tools.roofline import Ceilings, round_floor
from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import lane_config
from dspark_compile.model import Drafter


@pytest.mark.parametrize("lane_name,gigabytes,ms", [("qwen36_27b", 7.9, 1.9),
                                                     ("qwen36_35b_a3b", 0.9, 0.22)])
def test_floor_at_batch_1_matches_the_design_card(lane_name, gigabytes, ms):
    """At R=1, T=4096 a round moves the layers, lm_head, fc and W2 once per step (27B: about
    3.2 + 2.5 + 0.26 + 1.9 GB), over ~4.1 TB/s."""
    lane = lane_config(lane_name)
    with torch.device("meta"):  # shapes only
        drafter = Drafter(lane).to(lane.torch_dtype)
    floor = round_floor(drafter, 1, 4096, Ceilings(bandwidth=4.1e12, matmul=790e12))
    assert floor.bytes / 1e9 == pytest.approx(gigabytes, rel=0.05)
    assert floor.ms == pytest.approx(ms, rel=0.05)


def test_the_floor_reads_only_the_keys_a_sliding_layer_sees():
    """35B-A3B: every layer slides over 2048 positions, so a context of 4096 reads the
    window's and the block's keys, 2 (K and V) x 2 kv heads x 2057 x 256 x 2 bytes a layer
    and request, as a context of 2048 does."""
    lane = lane_config("qwen36_35b_a3b")
    with torch.device("meta"):
        drafter = Drafter(lane).to(lane.torch_dtype)
    ceilings = Ceilings(bandwidth=4.1e12, matmul=790e12)
    long, short = (round_floor(drafter, 64, context, ceilings) for context in (4096, 2048))
    assert long.bytes == short.bytes
    per_layer = 2 * 2 * (2048 + 9) * 256 * 2
    assert long.bytes - round_floor(drafter, 0, 4096, ceilings).bytes == pytest.approx(
        64 * (5 * per_layer + 10 * lane.feature_size * 2), rel=1e-9)


def test_bench_times_every_path_and_writes_json_and_png(tmp_path, device):
    drafter = random_drafter(lane_config("tiny_d2t"), device, seed=0)
    result = run_bench(drafter, ["eager"], [1, 2], context=32, artifacts_dir=tmp_path / "a",
                       repeats=2, warmup=1, seed=0)
    rows = result["rows"]
    assert [(r["batch"], r["path"]) for r in rows] == [
        (b, p) for b in (1, 2) for p in ("host", "device (eager)", "runtime (eager)")]
    for r in rows:
        assert r["identical"] and r["ms"] > 0 and r["floor_ms"] > 0
        # the step alone: timed for the runner's rows only
        assert (r["replay_ms"] > 0) if r["path"] == "runtime (eager)" else r["replay_ms"] is None
    # k = 5 int64 ids and float32 confidences a request; the runtime's one download also
    # holds the 7 rules kept, a byte each
    assert [r["d2h_bytes"] for r in rows if r["path"] != "host"] == [60, 67, 120, 127]
    assert result["ceilings"]["bandwidth"] > 0 and result["ceilings"]["matmul"] > 0
    json_path, png_path = write(result, tmp_path, "bench")
    assert json.loads(json_path.read_text())["rows"] == rows
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_command_prints_the_table_and_the_files(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", "from dspark_compile.cli import bench_main; bench_main()",
         "buckets=[1]", "context=16", "repeats=2", f"out_dir={tmp_path}",
         f"artifacts_dir={tmp_path / 'a'}"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[-2:] == [str(tmp_path / f"bench_tiny_cpu.{ext}") for ext in ("json", "png")]
    assert any(line.split()[:3] == ["tiny", "1", "host"] for line in lines)


def test_bench_runs_a_backend_that_forces_its_own_dtype(tmp_path):
    """onnx runs an fp32 copy: it gets fp32 inputs and is checked against that copy's host
    path (the bf16 host path's ids are another model's)."""
    pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")
    drafter = random_drafter(lane_config("tiny"), "cpu", seed=0)
    result = run_bench(drafter, ["onnx"], [1], context=16, artifacts_dir=tmp_path / "a",
                       repeats=1, warmup=0, seed=0)
    row = next(r for r in result["rows"] if r["path"] == "runtime (onnx)")
    assert row["identical"] is True and row["ms"] > 0
