"""The README's two commands, run back to back in one fresh venv, keep each other's
artifacts valid: the test set-up's packages (Triton among them) are not part of a CPU
artifact's environment key."""

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def readme_commands() -> tuple[str, str]:
    """The main job and the test set-up, as the README writes them, pointed at this
    checkout; the set-up stops before pytest, which is what runs this."""
    first, second = re.findall(r"```bash\n(python3 -m venv .*?)\n```", README)[:2]
    assert first.endswith("&& dspark-compile") and "&& pytest" in second
    first = first.replace("-e .", f"-e {ROOT}")
    second = second.replace("'.[dev]'", f"'{ROOT}[dev]'").split(" && pytest")[0]
    return first, second


def test_the_two_readme_commands_keep_each_others_artifacts(tmp_path, device):
    if device.type != "cpu":
        pytest.skip("the README's commands install from a package registry and run the CPU "
                    "main job: the CPU suite runs them")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}

    def sh(command: str) -> subprocess.CompletedProcess:
        done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        return done

    first, second = readme_commands()
    built = re.search(r"^built (\S+) in", sh(first).stdout, re.MULTILINE)
    assert built, "the main job built no artifact"
    sh(second)
    verified = sh(f". .venv/bin/activate && dspark-verify artifact={built[1]}")
    assert "another environment" not in verified.stderr
    again = sh(first)  # and the main job after the set-up: nothing to rebuild
    assert f"reused {built[1]} in" in again.stdout, again.stdout + again.stderr
    assert "another environment" not in again.stderr
