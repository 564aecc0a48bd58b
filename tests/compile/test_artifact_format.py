"""docs/artifacts.md against the code: the manifest a build writes, the environment, the
format version, the key's recipe and each backend's files."""

import hashlib
import json
import re
from pathlib import Path

from dspark_compile.checkpoint import random_drafter
from dspark_compile.compile import build_artifact
from dspark_compile.compile.key import FORMAT_VERSION, environment
from dspark_compile.config import lane_config

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "artifacts.md").read_text()


def table(section: str) -> dict[str, str]:
    """The first column (a backticked name) of a section's table -> its second column."""
    body = PAGE.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^\| `([^`]+)` \| ([^|]+) \|", body, re.MULTILINE))


def test_the_page_holds_the_manifest_the_key_and_the_environment(tmp_path):
    drafter = random_drafter(lane_config("tiny"), "cpu", seed=0)
    path, _ = build_artifact(drafter, "eager", [1, 2], tmp_path)
    manifest = json.loads((path / "manifest.json").read_text())
    assert set(table("manifest.json")) == set(manifest)
    assert f"Format version: **{FORMAT_VERSION}**." in PAGE
    recipe = [manifest[f] for f in ("format_version", "lane", "weights_sha256", "backend",
                                    "buckets", "env", "with_probs")]
    assert json.loads(manifest["key_text"]) == recipe
    assert manifest["key"] == hashlib.sha256(manifest["key_text"].encode()).hexdigest()
    assert manifest["key"] == hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()
                                             ).hexdigest()
    lanehash = hashlib.sha256(json.dumps(recipe[:3] + [recipe[5]], sort_keys=True).encode()
                              ).hexdigest()[:12]
    assert path.relative_to(tmp_path).parts == (f"tiny-{lanehash}", "eager", "1-2")
    env = table("env")
    assert {name for name, when in env.items() if when.strip() in ("always", "CPU")} == set(
        environment("cpu"))
    assert {name for name, when in env.items() if when.strip() == "CUDA"} == {
        "gpu", "capability", "triton"}


def test_the_page_names_each_backends_files():
    from dspark_compile.compile.backends import REGISTRY
    from dspark_compile.compile.backends import aoti, inductor

    files = table("Files")
    assert set(files) == set(REGISTRY)
    assert aoti.PREFILL in files["aoti"] and inductor.KERNELS in files["inductor"]
    assert inductor._bucket_file(Path(), 3).name.replace("3", "<b>") in files["inductor"]
