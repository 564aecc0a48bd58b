import subprocess
import sys
from pathlib import Path


def run(*args):
    return subprocess.run([sys.executable, "-m", "dspark_compile", *args],
                          capture_output=True, text=True, timeout=600)


def table(stdout):
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["lane", "batch"])
    header = lines[start].split()
    rows = [line.split("  ") for line in lines[start + 1:-1]]
    return header, [[c.strip() for c in row if c.strip()] for row in rows]


def test_main_command_default_builds_verifies_and_prints_the_path_last(tmp_path):
    result = run(f"artifacts_dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "lane tiny, backend inductor, buckets [1, 4], device cpu"
    assert any(line.startswith(f"built {tmp_path}/tiny-") for line in lines)
    # the build's phases as lines with their times (stderr is not a terminal here)
    phases = [line for line in result.stderr.splitlines() if line.startswith("building ")]
    assert [p.split("] ", 1)[1] for p in phases] == [
        "writing the weights", "bucket 1 (1/2): tracing, lowering and compiling",
        "bucket 4 (2/2): tracing, lowering and compiling",
        "bundling the compiled kernels",
        "hashing the files"]
    assert any('"identical": true' in line for line in lines)  # the fresh-process verify
    artifact = Path(lines[-1])
    assert artifact.parent.name == "inductor" and (artifact / "manifest.json").is_file()
    header, rows = table(result.stdout)
    assert header == ["lane", "batch", "path", "identical", "d2h_bytes", "ms"]
    assert [r[2] for r in rows] == ["host (4 rows)", "device (eager)", "runtime (inductor)"]
    assert [r[3] for r in rows] == ["reference", "True", "True"]
    assert int(rows[1][4]) == 3 * 5 * 12  # batch x k x (int64 id + f32 confidence)


def test_main_command_reuses_and_takes_overrides(tmp_path):
    args = ["lane=tiny_d2t", "lane.markov_head=gated", "backend=eager", "batch=2",
            "buckets=[2]", f"artifacts_dir={tmp_path}"]
    assert run(*args).returncode == 0
    result = run(*args)
    assert result.returncode == 0, result.stderr
    assert "reused " in result.stdout and "tiny_d2t  2" in result.stdout

