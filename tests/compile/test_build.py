"""Building an artifact bucket by bucket: an interrupted build keeps what it finished."""

import json

import pytest

from dspark_compile.checkpoint import random_drafter
from dspark_compile.compile import build_artifact
from dspark_compile.compile.backends import get_backend
from dspark_compile.config import lane_config
from dspark_compile.runtime import load_runner


@pytest.fixture
def counted(monkeypatch):
    """The eager backend, each bucket's payload a file, the buckets it compiled listed, and
    a Ctrl-C at the bucket named in ``interrupt_at``."""
    eager = get_backend("eager")
    compiled, interrupt_at = [], []

    def compile_bucket(step, bucket, example, out_dir):
        if bucket in interrupt_at:
            interrupt_at.remove(bucket)
            raise KeyboardInterrupt
        (out_dir / f"payload{bucket}").write_text(str(bucket))
        compiled.append(bucket)

    monkeypatch.setattr(eager, "compile_bucket", compile_bucket)
    return compiled, interrupt_at


def test_an_interrupted_build_resumes_after_its_last_finished_bucket(tmp_path, counted,
                                                                     capsys):
    compiled, interrupt_at = counted
    drafter = random_drafter(lane_config("tiny"), "cpu", seed=0)
    interrupt_at.append(4)
    with pytest.raises(KeyboardInterrupt):
        build_artifact(drafter, "eager", [1, 2, 4], tmp_path)
    staging, = tmp_path.glob("tiny-*/eager/.1-2-4.partial")
    assert not staging.with_name("1-2-4").exists()
    assert sorted(p.name for p in staging.iterdir() if p.name.startswith("payload")) == [
        "payload1", "payload2"]
    capsys.readouterr()

    path, built = build_artifact(drafter, "eager", [1, 2, 4], tmp_path)
    assert built and compiled == [1, 2, 4]  # buckets 1 and 2 not compiled again
    progress = capsys.readouterr().err
    assert "bucket 1 (1/3): kept from an interrupted build" in progress
    assert "bucket 2 (2/3): kept from an interrupted build" in progress
    assert not staging.exists()
    manifest = json.loads((path / "manifest.json").read_text())
    assert sorted(manifest["files"]) == ["payload1", "payload2", "payload4",
                                         "weights.safetensors"]
    assert load_runner(path, "cpu").buckets == [1, 2, 4]


def test_an_interrupt_before_any_bucket_finished_leaves_nothing(tmp_path, counted):
    compiled, interrupt_at = counted
    interrupt_at.append(1)
    with pytest.raises(KeyboardInterrupt):
        build_artifact(random_drafter(lane_config("tiny"), "cpu", seed=0), "eager", [1, 2],
                       tmp_path)
    assert [p.name for p in tmp_path.rglob("*")] == [".locks"]
