"""The README's Python snippets run as written, each in a fresh process of its own."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)


def test_the_readme_has_its_snippets():
    assert len(SNIPPETS) == 2


@pytest.mark.parametrize("snippet", SNIPPETS, ids=["load_runner", "draft"])
def test_a_readme_snippet_runs_as_written(tmp_path, snippet):
    result = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip()
    if "HostPath" in snippet:  # the eager device path is the host path's, token for token
        assert result.stdout.count("True") == 3 and "False" not in result.stdout
