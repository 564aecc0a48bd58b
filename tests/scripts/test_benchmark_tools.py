"""The benchmark tools of ``scripts/`` run as their docstrings say, each checked against
something it did not compute itself: the profiler's own operator names, the artifact's
size on disk, the eager loop's ids."""

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

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
    assert {r["path"] for r in rows} == {"loop (eager)", "loop (fused)", "loop (certified)"}
    assert {r["batch"] for r in rows} == {1, 8}
    assert all(r["ids_compared"] > 0 and r["ids_differing"] == 0 for r in rows)
    assert all(r["ids_differing_from_fused"] == 0 for r in rows)


def test_real_rounds_tiled_into_a_wider_lane_walk_as_the_drafter_does(tmp_path):
    """``markov_loop_bench.tiled_head``: a small drafter's rounds, tiled into a lane of 4.5
    times the vocabulary and 4 times the rank, walk to the drafter's own ids."""
    import torch
    from safetensors.torch import save_file

    sys.path.insert(0, str(SCRIPTS))
    from markov_loop_bench import tiled_head
    from dspark_compile.checkpoint import random_drafter
    from dspark_compile.config import lane_config
    from dspark_compile.draft.markov import markov_loop

    small = random_drafter(lane_config("tiny"), "cpu", seed=2)
    head, V, k = small.markov_head, small.lane.draft_vocab_size, small.lane.k
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, k, V, generator=g).mul(3).bfloat16()
    anchor = torch.randint(0, V, (6,), generator=g)
    save_file({"base": base, "anchor": anchor, "w1": head.markov_w1.weight.contiguous(),
               "w2": head.markov_w2.weight.contiguous()}, str(tmp_path / "rounds.safetensors"))
    wide = lane_config("tiny", target_vocab_size=9 * V // 2, draft_vocab_size=9 * V // 2,
                       markov_rank=4 * small.lane.markov_rank, k=k + 3)
    lane, tiled, tiled_base, tiled_anchor = tiled_head(wide, str(tmp_path / "rounds.safetensors"),
                                                      torch.device("cpu"))
    assert lane.k == k and tiled_base.shape == (6, k, 9 * V // 2)
    inputs = dict(h=torch.zeros(6, k, 1), state=None, temperature=torch.zeros(6),
                  seed=torch.zeros(6, dtype=torch.long),
                  anchor_pos=torch.zeros(6, dtype=torch.long), keep_logits=False)
    expected = markov_loop(small, base_logits=base, anchor=anchor, **inputs)[0]
    walked = markov_loop(SimpleNamespace(markov_head=tiled, d2t=None, lane=lane),
                         base_logits=tiled_base, anchor=tiled_anchor, **inputs)[0]
    assert torch.equal(walked, expected)


def test_loop_overhead_times_rounds_whose_greedy_text_is_the_bigram_walk(tmp_path, device):
    out = tmp_path / "overhead.json"
    run_script("loop_overhead.py", "--backend", "eager", "--batches", "1", "2",
               "--new-tokens", "12", "--device", device.type,
               "--artifacts-dir", str(tmp_path / "a"), "--out", str(out), cwd=tmp_path)
    rows = json.loads(out.read_text())["rows"]
    assert [(r["temperature"], r["batch"]) for r in rows] == [(0.0, 1), (0.0, 2), (1.0, 1),
                                                              (1.0, 2)]
    for row in rows:
        # a round makes 1 .. k+1 tokens a request (the tiny lane's k is 5)
        assert 12 / 6 <= row["rounds"] <= 12
        assert 0 < row["pass_ms"] < row["ms_per_round"]
        assert 0 < row["draft_ms"] <= row["outside_pass_ms"] <= row["ms_per_round"]
    assert [r["greedy_walks"] for r in rows[:2]] == [1, 2]
