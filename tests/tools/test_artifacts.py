"""dspark-artifacts: the cache listed with what loads here, and cleaned."""

import json
import shutil
import subprocess
import sys

import pytest

from dspark_compile.checkpoint import random_drafter
from dspark_compile.compile import build_artifact
from dspark_compile.config import lane_config
from dspark_compile.tools import artifacts


@pytest.fixture
def cache(tmp_path):
    """Four eager artifacts: current, of another Python, with a garbled manifest, and a
    build stopped midway (its staging directory)."""
    root = tmp_path / "artifacts"
    paths = [build_artifact(random_drafter(lane_config("tiny"), "cpu", seed=s), "eager", [1],
                            root)[0] for s in range(3)]
    manifest = json.loads((paths[1] / "manifest.json").read_text())
    manifest["env"]["python"] = "2.7.18"
    (paths[1] / "manifest.json").write_text(json.dumps(manifest))
    (paths[2] / "manifest.json").write_text("{garbled")
    (paths[0].parent / ".1-2.partial").mkdir()  # a build stopped after its bucket 1
    (paths[0].parent / ".1-2.partial" / ".finished_buckets").write_text("[1]")
    return root, paths


def run(*args):
    return subprocess.run([sys.executable, "-m", "dspark_compile", "artifacts", *args],
                          capture_output=True, text=True, timeout=300)


def test_list_says_which_load_here(cache):
    root, paths = cache
    result = run("list", "--dir", str(root))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["key", "lane", "backend", "buckets", "device", "MB", "state"]
    states = sorted(line.split(None, 6)[-1] for line in lines[1:])
    assert states == ["current", "damaged: JSONDecodeError", "partial", "stale: python differ"]


def test_clean_stale_keeps_what_loads_and_clean_removes_the_rest(cache, monkeypatch, tmp_path):
    root, paths = cache
    result = run("clean", "--stale", "--dir", str(root))
    assert result.returncode == 0 and len(result.stdout.splitlines()) == 3, result.stdout
    assert [e.path for e in artifacts.entries(root)] == [paths[0]]
    inductor, triton = tmp_path / "inductor", tmp_path / "triton"
    for folder in (inductor, triton):
        (folder / "x").mkdir(parents=True)
    monkeypatch.setattr(artifacts, "compiler_caches", lambda: [inductor, triton])
    artifacts.main(["clean", "--caches", "--dir", str(root)])
    assert not artifacts.entries(root) and not inductor.exists() and not triton.exists()
    assert [p.name for p in root.iterdir()] == [".locks"]


def test_a_missing_cache_is_one_line_and_status_2(tmp_path):
    result = run("list", "--dir", str(tmp_path / "none"))
    assert result.returncode == 2
    assert result.stderr == f"dspark-artifacts: no artifact cache at {tmp_path / 'none'}\n"
