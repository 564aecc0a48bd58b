"""The package as a user installs it: a wheel, used from outside the checkout."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_built_wheel_runs_from_outside_the_checkout(tmp_path):
    wheels, site, elsewhere = tmp_path / "wheels", tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    pip = [sys.executable, "-m", "pip", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(wheels), str(ROOT)], check=True,
                   timeout=300)
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site),
                    *map(str, wheels.glob("*.whl"))], check=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(site)}

    def run(*args):
        return subprocess.run([sys.executable, *args], cwd=elsewhere, env=env,
                              capture_output=True, text=True, timeout=300)
    found = run("-c", "import dspark_compile as ds; print(ds.__file__); "
                      "print(ds.lane_config('tiny_d2t').draft_vocab_size)")
    assert found.returncode == 0, found.stderr
    path, vocab = found.stdout.split()
    assert Path(path).is_relative_to(site) and vocab == "128"
    composed = run("-m", "dspark_compile", "lane=qwen36_27b", "--cfg", "job")
    assert composed.returncode == 0, composed.stderr
    assert "hidden_size: 5120" in composed.stdout
