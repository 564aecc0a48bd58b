import hashlib
import json
import os
import re
import stat
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import dspark_compile
from dspark_compile.compile import build_artifact
from dspark_compile.compile.key import (ArtifactKey, compiled_sources, environment,
                                        imported_modules)
from dspark_compile.compile import key as key_module, store
from dspark_compile.compile.store import ARTIFACT_WEIGHTS, MANIFEST, read_manifest
from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import lane_config
from dspark_compile.errors import ArtifactError
from dspark_compile.runtime import load_runner


@pytest.fixture
def artifact(tmp_path):
    """A fresh eager artifact of its own, safe to damage."""
    drafter = random_drafter(lane_config("tiny"), "cpu", seed=0)
    return build_artifact(drafter, "eager", [1, 2], tmp_path / "root")[0]


def edit_manifest(path, change, rekey=False):
    manifest = json.loads((path / MANIFEST).read_text())
    change(manifest)
    if rekey:  # what a genuine build elsewhere would have written
        key = ArtifactKey(manifest["lane"], manifest["weights_sha256"], manifest["backend"],
                          tuple(manifest["buckets"]), manifest["env"], manifest["with_probs"])
        manifest["key"], manifest["key_text"] = key.digest(), key.text()
    (path / MANIFEST).write_text(json.dumps(manifest))


def test_layout_and_manifest(artifact, tmp_path):
    assert artifact.parent.parent.parent == tmp_path / "root"
    assert artifact.parent.name == "eager" and artifact.name == "1-2"
    assert artifact.parent.parent.name.startswith("tiny-")
    manifest = read_manifest(artifact, environment("cpu"))
    assert manifest["buckets"] == [1, 2] and manifest["dtype"] == "bfloat16"
    assert manifest["env"]["torch"] == torch.__version__ and manifest["k"] == 5
    assert set(manifest["files"]) == {ARTIFACT_WEIGHTS}
    # the key records what "auto" chose on the CPU, not "auto"
    assert [manifest["lane"][field] for field in ("fused_markov_step", "fused_attention",
                                                  "skinny_gemm")] == [False, False, False]


def test_second_build_of_a_key_is_a_cache_hit(artifact, tmp_path):
    before = (artifact / MANIFEST).read_text()
    drafter = random_drafter(lane_config("tiny"), "cpu", seed=0)
    path, built = build_artifact(drafter, "eager", [2, 1], tmp_path / "root")
    assert (path, built) == (artifact, False)
    assert (artifact / MANIFEST).read_text() == before


def test_an_artifact_of_another_key_in_this_keys_place_is_rebuilt(artifact, tmp_path):
    """Copied or renamed into the wrong directory, an artifact passes its own checks: the
    lookup also compares the manifest's key with the key asked for."""
    other = build_artifact(random_drafter(lane_config("tiny_d2t"), "cpu", seed=0), "eager",
                           [1, 2], tmp_path / "root")[0]
    shutil.rmtree(artifact)
    shutil.copytree(other, artifact)
    drafter = random_drafter(lane_config("tiny"), "cpu", seed=0)
    path, built = build_artifact(drafter, "eager", [1, 2], tmp_path / "root")
    assert (path, built) == (artifact, True)
    assert json.loads((artifact / MANIFEST).read_text())["lane"]["name"] == "tiny"


def test_artifact_files_follow_the_umask(tmp_path):
    """A shared artifacts_dir: every file, the weights too (safetensors writes 0600), is
    readable by whoever the umask lets read it."""
    old = os.umask(0o022)
    try:
        path = build_artifact(random_drafter(lane_config("tiny"), "cpu"), "eager", [1],
                              tmp_path)[0]
    finally:
        os.umask(old)
    for name in (ARTIFACT_WEIGHTS, MANIFEST):
        assert stat.S_IMODE((path / name).stat().st_mode) == 0o644, name


def test_other_weights_make_another_key(artifact, tmp_path):
    drafter = random_drafter(lane_config("tiny"), "cpu", seed=1)
    path, built = build_artifact(drafter, "eager", [1, 2], tmp_path / "root")
    assert built and path != artifact


def test_tampered_payload_is_refused(artifact):
    data = bytearray((artifact / ARTIFACT_WEIGHTS).read_bytes())
    data[-1] ^= 1
    (artifact / ARTIFACT_WEIGHTS).write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="weights.safetensors fails its sha256 check"):
        load_runner(artifact, "cpu")


@pytest.fixture
def chunked(tmp_path, monkeypatch, device):
    """An eager artifact whose weights (370 KB) are past a 64 KiB chunk size."""
    monkeypatch.setattr(store, "CHUNK_BYTES", 1 << 16)
    drafter = random_drafter(lane_config("tiny"), device, seed=0)
    return build_artifact(drafter, "eager", [1], tmp_path / "root")[0]


def test_a_large_file_has_a_sha256_for_each_chunk(chunked):
    manifest = json.loads((chunked / MANIFEST).read_text())
    data = (chunked / ARTIFACT_WEIGHTS).read_bytes()
    record = manifest["chunks"][ARTIFACT_WEIGHTS]
    size = 1 << 16
    assert (record["bytes"], record["size"]) == (size, len(data)) and len(data) > 2 * size
    assert record["sha256"] == [hashlib.sha256(data[i:i + size]).hexdigest()
                                for i in range(0, len(data), size)]
    assert manifest["files"][ARTIFACT_WEIGHTS] == hashlib.sha256(data).hexdigest()
    assert list(manifest["chunks"]) == [ARTIFACT_WEIGHTS]  # the small manifest is whole


@pytest.mark.parametrize("damage", ["a byte of the second chunk", "the last byte cut",
                                    "a byte appended"])
def test_a_damaged_chunk_is_refused(chunked, damage, device):
    """The weights are checked chunk by chunk as a load reads them for use."""
    data = bytearray((chunked / ARTIFACT_WEIGHTS).read_bytes())
    if damage == "a byte of the second chunk":
        data[(1 << 16) + 5] ^= 1
    elif damage == "the last byte cut":
        data = data[:-1]
    else:
        data.append(0)
    (chunked / ARTIFACT_WEIGHTS).write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="weights.safetensors fails its sha256 check"):
        load_runner(chunked, device)


def test_a_malformed_chunk_record_is_refused(chunked):
    edit_manifest(chunked, lambda m: m["chunks"][ARTIFACT_WEIGHTS]["sha256"].pop())
    with pytest.raises(ArtifactError, match="one sha256 a chunk"):
        load_runner(chunked, "cpu")


def edit_key_text(manifest):  # the text says what the edited field says; the key is old
    fields = json.loads(manifest["key_text"])
    fields[1]["sliding_causal"] = manifest["lane"]["sliding_causal"] = False
    manifest["key_text"] = json.dumps(fields, sort_keys=True)


@pytest.mark.parametrize("tamper", [lambda m: m["lane"].update(sliding_causal=False),
                                    edit_key_text, lambda m: m.update(key_text="[3, {")])
def test_tampered_manifest_is_refused(artifact, tamper):
    edit_manifest(artifact, tamper)
    with pytest.raises(ArtifactError, match="does not match its key"):
        load_runner(artifact, "cpu")


def test_manifest_from_another_torch_version_is_refused(artifact):
    other = f"{torch.__version__}.other"  # never the running version, on any machine
    edit_manifest(artifact, lambda m: m["env"].update(torch=other), rekey=True)
    with pytest.raises(ArtifactError, match=r"another environment.*torch: artifact "
                                            f"'{re.escape(other)}', running"):
        load_runner(artifact, "cpu")


def test_artifact_of_other_draft_step_code_is_refused(artifact):
    edit_manifest(artifact, lambda m: m["env"].update(dspark_code="0123456789abcdef"),
                  rekey=True)
    with pytest.raises(ArtifactError, match="dspark_code: artifact '0123456789abcdef'"):
        load_runner(artifact, "cpu")


def test_code_fingerprint_covers_every_module_the_draft_step_imports():
    package = Path(dspark_compile.__file__).parent
    sources = {str(p.relative_to(package)) for p in compiled_sources()}
    # draft/sampling.py imports rng, draft/markov.py the kernels, model/__init__.py heads.py
    assert {"draft/step.py", "rng.py", "kernels/markov/kernels.py", "model/heads.py",
            "model/vocab.py", "compile/backends/aoti.py", "config.py"} <= sources
    assert not sources & {"runtime/runner.py", "tools/bench.py", "compile/store.py", "cli.py"}


def test_the_environment_names_the_triton_that_imports():
    """The environment reads Triton's version from its package's metadata; the module
    itself must say the same (where it is installed)."""
    triton = pytest.importorskip("triton", reason="CPU wheels of torch come without Triton")
    assert key_module.triton_version().split("+")[0] == triton.__version__  # +git: nightly


def test_a_cpu_key_does_not_move_when_triton_comes_or_goes(monkeypatch):
    """The tests' set-up installs Triton into the environment the main command built in:
    a CPU artifact's code never imports it, so its key must stay."""
    monkeypatch.setattr(key_module, "triton_version", lambda: None)
    without = environment("cpu")
    monkeypatch.setattr(key_module, "triton_version", lambda: "3.6.0")
    assert environment("cpu") == without and "triton" not in without


def test_the_import_scan_finds_every_import_the_python_parser_finds():
    """The fingerprint's scan parses import statements only; Python's parser, walking
    every node of each of the package's modules, must find no import it misses."""
    import ast
    package = Path(dspark_compile.__file__).parent
    for path in package.rglob("*.py"):
        parsed = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                parsed.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                parsed |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        assert parsed <= imported_modules(path.read_text()), path
    tricky = "def f():\n    from a.b import (c,  # why\n        d as e)\n    import f.g, h\n"
    assert imported_modules(tricky) == {"a.b", "a.b.c", "a.b.d", "f.g", "h"}


def test_manifest_naming_a_file_outside_the_artifact_is_refused(artifact):
    edit_manifest(artifact, lambda m: m["files"].update({"../escape": "0" * 64}))
    with pytest.raises(ArtifactError, match="points outside the artifact"):
        load_runner(artifact, "cpu")


def test_half_written_artifact_is_refused(artifact, tmp_path):
    partial = tmp_path / "partial"
    shutil.copytree(artifact, partial)
    (partial / MANIFEST).unlink()  # what a build killed before its last write leaves
    with pytest.raises(ArtifactError, match="half-written"):
        load_runner(partial, "cpu")


def test_damaged_artifact_is_rebuilt_not_reused(artifact, tmp_path):
    (artifact / ARTIFACT_WEIGHTS).write_bytes(b"garbage")
    drafter = random_drafter(lane_config("tiny"), "cpu", seed=0)
    path, built = build_artifact(drafter, "eager", [1, 2], tmp_path / "root")
    assert path == artifact and built
    load_runner(path, "cpu")


BUILD = """
import sys
from dspark_compile.compile import build_artifact
from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import lane_config
path, built = build_artifact(random_drafter(lane_config("tiny"), "cpu", 0), "onnx", [2],
                             sys.argv[1])
print(path, built)
"""


def test_two_concurrent_builds_leave_one_valid_artifact(tmp_path, fresh_verify):
    builders = [subprocess.Popen([sys.executable, "-c", BUILD, str(tmp_path)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(2)]
    results = [b.communicate(timeout=600) for b in builders]
    assert all(b.returncode == 0 for b in builders), [err for _, err in results]
    outcomes = sorted(out.splitlines()[-1].split() for out, _ in results)
    assert outcomes[0][0] == outcomes[1][0]  # the same directory
    assert [o[1] for o in outcomes] == ["False", "True"]  # one built, one reused
    artifact = outcomes[0][0]
    siblings = sorted(p.name for p in tmp_path.glob("tiny-*/onnx/*"))
    assert siblings == ["2"]  # no temporary directories left behind, no lock beside it
    code, report, stderr = fresh_verify(artifact, "device=cpu")
    assert code == 0 and report["identical"], stderr


@pytest.mark.parametrize("phase", ["writing the weights", "exporting to ONNX",
                                   "hashing the files"])
def test_a_build_killed_in_a_phase_leaves_nothing_loadable_and_the_next_succeeds(tmp_path,
                                                                               phase):
    """SIGKILL (no clean-up runs) once the build reports ``phase`` on stderr."""
    builder = subprocess.Popen([sys.executable, "-c", BUILD, str(tmp_path)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in builder.stderr:  # the build's own progress, not a clock
        if phase in line:
            builder.kill()
            break
    assert builder.wait(timeout=300) == -9  # killed, not finished
    assert not list(tmp_path.glob("tiny-*/onnx/[!.]*"))  # nothing visible
    result = subprocess.run([sys.executable, "-c", BUILD, str(tmp_path)], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    final = Path(result.stdout.splitlines()[-1].split()[0])
    load_runner(final, "cpu")
    assert [p.name for p in final.parent.iterdir()] == ["2"]  # no dead build's staging


LOAD_AND_BUILD = BUILD + """
from dspark_compile.runtime import load_runner
from dspark_compile.tools.rounds import synthetic_rounds
runner = load_runner(path, "cpu")
slot = runner.admit()
runner.draft(next(synthetic_rounds(runner.lane, 1, 8, 1, 0, "cpu")), [slot])
print("drafted")
"""


def test_four_processes_building_and_loading_two_keys_at_once(tmp_path):
    scripts = [LOAD_AND_BUILD, LOAD_AND_BUILD.replace('"tiny"', '"tiny_d2t"')] * 2
    workers = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for script in scripts]
    outputs = [w.communicate(timeout=900) for w in workers]
    assert all(w.returncode == 0 for w in workers), [err[-2000:] for _, err in outputs]
    assert all(out.splitlines()[-1] == "drafted" for out, _ in outputs)
    artifacts = sorted(p for p in tmp_path.glob("*/onnx/*") if not p.name.startswith("."))
    assert [p.parent.parent.name.split("-")[0] for p in artifacts] == ["tiny", "tiny_d2t"]
    for artifact in artifacts:
        load_runner(artifact, "cpu")
