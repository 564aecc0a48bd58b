import subprocess
import sys


def run(*args):
    return subprocess.run([sys.executable, "-m", "dspark_compile", *args],
                          capture_output=True, text=True, timeout=300)


def test_main_command_default_runs_the_tiny_lane_and_agrees():
    result = run()
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("lane tiny, backend eager, device cpu")
    host = next(line.split() for line in lines if " host " in line)
    device = next(line.split() for line in lines if "device (eager)" in line)
    assert host[3] == "reference" and device[4] == "True"
    assert int(device[5]) == 3 * 5 * 12  # batch x k x (int64 id + f32 confidence)


def test_main_command_takes_overrides():
    result = run("lane=tiny_d2t", "lane.markov_head=gated", "batch=2", "rounds=2")
    assert result.returncode == 0, result.stderr
    assert "tiny_d2t  2" in result.stdout


def test_main_command_names_an_unknown_key():
    result = run("lane.nope=1")
    assert result.returncode != 0
    assert "nope" in result.stderr
