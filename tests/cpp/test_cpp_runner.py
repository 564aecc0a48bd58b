"""The C++ runtime (cpp/), built here with CMake against this torch: it drafts what the
Python runner drafts, bit for bit, its outputs pass dspark-verify's replay against the host
path, and it refuses what the Python side refuses, with the same messages."""

import dataclasses
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.utils
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from dspark_compile.compile.store import ARTIFACT_WEIGHTS, MANIFEST
from dspark_compile.draft.checks import RULES
from dspark_compile.errors import ArtifactError, InputError
from dspark_compile.runtime import load_runner
from dspark_compile.runtime.schedule import StepsPerSecond
from dspark_compile.tools.verify import plan, record_rounds, save_rounds, verify_artifact

ROOT = Path(__file__).resolve().parents[2]
CPP = ROOT / "cpp"
ROUNDS, SEED = 6, 3


def readme_example() -> str:
    """The README's C++ example, as written."""
    readme = (ROOT / "README.md").read_text()
    return readme.split("```cpp\n", 1)[1].split("```", 1)[0]


def readme_cmake() -> str:
    """The README's lines of an engine's CMake project."""
    readme = (ROOT / "README.md").read_text()
    return readme.split("```cmake\n", 1)[1].split("```", 1)[0]


CONSUMER = """cmake_minimum_required(VERSION 3.18)
project(engine CXX)
set(CMAKE_CXX_STANDARD 17)
add_executable(engine readme_example.cpp)
"""


def cmake(*args: str) -> None:
    result = subprocess.run(["cmake", *args], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.fixture(scope="module")
def cpp_build(tmp_path_factory) -> dict[str, Path]:
    """dspark-draft-cpp, configured, built and installed in this test run, and the README's
    example built by a project of its own that finds the installed package, as an engine
    would: their paths, as ``tool`` and ``engine``."""
    # the dev extra installs both (CMake from PyPI): missing, the suite fails, never skips
    assert shutil.which("cmake"), "no cmake: pip install -e '.[dev]' brings it"
    # found, not imported: its __init__ needs importlib_resources, which the build does not
    nlohmann_json = importlib.util.find_spec("nlohmann_json")
    assert nlohmann_json, "no nlohmann_json: pip install -e '.[dev]' brings its headers"
    build, install, engine = (tmp_path_factory.mktemp(name) for name in
                              ("cpp-build", "cpp-install", "engine"))
    jobs = str(os.cpu_count() or 2)
    # no CMAKE_BUILD_TYPE: unoptimised, a third faster to build; the rounds here are tiny
    cmake("-S", str(CPP), "-B", str(build), f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
          f"-DNLOHMANN_JSON_INCLUDE_DIR={Path(nlohmann_json.origin).parent / 'include'}")
    cmake("--build", str(build), "-j", jobs)
    cmake("--install", str(build), "--prefix", str(install))
    (engine / "readme_example.cpp").write_text(readme_example())
    (engine / "CMakeLists.txt").write_text(CONSUMER + readme_cmake())
    cmake("-S", str(engine), "-B", str(engine / "build"),
          f"-DCMAKE_PREFIX_PATH={install};{torch.utils.cmake_prefix_path}")
    cmake("--build", str(engine / "build"), "-j", jobs)
    return {"tool": install / "bin" / "dspark-draft-cpp", "engine": engine / "build" / "engine"}


@pytest.fixture(scope="module")
def draft_cpp(cpp_build) -> Path:
    return cpp_build["tool"]


def test_the_readmes_engine_drafts_with_the_installed_package(cpp_build, built_artifact):
    """The README's C++ example, built by a project of its own against the installed
    package (the fixture), drafts a round of k ids on an aoti artifact."""
    result = subprocess.run([str(cpp_build["engine"]), str(built_artifact("aoti", LANE))],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[ CPULongType{1,5} ]" in result.stdout


def draft_in_cpp(tool: Path, artifact: Path, rounds: Path, outputs: Path
                 ) -> subprocess.CompletedProcess:
    return subprocess.run([str(tool), str(artifact), str(rounds), str(outputs)],
                          capture_output=True, text=True, timeout=600)


# tiny_d2t alone: the C++ runner knows no lane's geometry (the graph holds it), and
# tiny_d2t's step holds all of tiny's plus d2t; a second CPU AOTInductor build is minutes
LANE = "tiny_d2t"


def test_the_cpp_runner_drafts_the_python_runners_bits_and_passes_the_replay(
        draft_cpp, built_artifact, device, tmp_path):
    artifact = built_artifact("aoti", LANE)
    rounds, outputs = tmp_path / "rounds.safetensors", tmp_path / "outputs.safetensors"
    # prompts of 12-24 rows, through the compiled prefill; T = 1: the odd rows sample, the
    # even rows draft greedily
    record_rounds(artifact, rounds, device.type, ROUNDS, seed=SEED, temperature=1.0)
    # and scheduled: Algorithm 1's lengths, by a step that costs 3 + 0.7 per token
    with safe_open(str(rounds), framework="pt") as f:
        recorded, metadata = {n: f.get_tensor(n) for n in f.keys()}, f.metadata()
    sps = StepsPerSecond((1, 40), (1 / 3.7, 1 / 31.0))
    recorded["steps_per_second"] = sps.table(3 * 6)  # bucket 3, k + 1 = 6
    save_file(recorded, str(rounds), metadata=metadata)
    result = draft_in_cpp(draft_cpp, artifact, rounds, outputs)
    assert result.returncode == 0, result.stderr

    report = verify_artifact(artifact, device.type, replay=outputs)
    assert report["identical"] and report["first_mismatch"] is None, report
    assert report["tokens_compared"] == ROUNDS * 2 * 5  # bucket 3 drafts for 2, k = 5

    drafted = load_file(outputs)
    lengths = set()
    for key, out in scheduled_rounds(artifact, device, sps):
        assert torch.equal(out.ids, drafted[f"{key}.ids"]), key
        assert torch.equal(out.confidences, drafted[f"{key}.confidences"]), key
        assert torch.equal(out.lengths, drafted[f"{key}.lengths"]), key
        lengths.update(out.lengths.tolist())
    assert len(lengths) > 1  # the schedule verifies more of some rows than of others


def scheduled_rounds(artifact, device, sps: StepsPerSecond, lag: int = 0):
    """The recorded rounds' plan through the Python runner scheduled by ``sps`` (and
    ``lag``): each round's key in the C++ tool's outputs, and its output."""
    runner = load_runner(artifact, device)
    runner.schedule(sps, lag)
    for bucket, batch, inputs in plan(runner.lane, runner.buckets, ROUNDS, 24, SEED, 1.0,
                                      device.type):
        slots = [runner.admit() for _ in range(batch)]
        for index, round_inputs in enumerate(inputs):
            yield f"b{bucket}.r{index}", runner.draft(round_inputs, slots)


@pytest.mark.parametrize("lag", [0, 2])
def test_the_cpp_runner_schedules_by_width_as_the_python_runner_does(
        draft_cpp, built_artifact, device, tmp_path, lag):
    """A target that charges a step by its widest row: metadata ``schedule_by=width`` and a
    table by a row's tokens, the C++ runner's lengths equal to the Python runner's; with
    ``schedule_lag=2``, each request's from its confidences of two rounds before."""
    artifact = built_artifact("aoti", LANE)
    rounds, outputs = tmp_path / "rounds.safetensors", tmp_path / "outputs.safetensors"
    record_rounds(artifact, rounds, device.type, ROUNDS, seed=SEED, temperature=1.0)
    with safe_open(str(rounds), framework="pt") as f:
        recorded, metadata = {n: f.get_tensor(n) for n in f.keys()}, f.metadata()
    widths = tuple(range(1, 7))  # k + 1 = 6; the rows of bucket 3 affine in 3 x width
    sps = StepsPerSecond(widths, tuple(1 / (3.0 + 2.1 * w) for w in widths), by="width")
    recorded["steps_per_second"] = sps.table(6)
    save_file(recorded, str(rounds),
              metadata=metadata | {"schedule_by": "width", "schedule_lag": str(lag)})
    result = draft_in_cpp(draft_cpp, artifact, rounds, outputs)
    assert result.returncode == 0, result.stderr
    drafted = load_file(outputs)
    lengths = set()
    for key, out in scheduled_rounds(artifact, device, sps, lag):
        assert torch.equal(out.lengths, drafted[f"{key}.lengths"]), key
        lengths.update(out.lengths.tolist())
    fresh = {5} if lag else set()  # k: a request's first rounds, with none that old
    assert len(lengths - fresh) > 1  # rounds of several widths


def test_the_check_script_follows_this_torch_and_writes_only_its_out(draft_cpp, built_artifact,
                                                                     device, tmp_path):
    """scripts/cpp_runner_check.py (the README's C++ section presents it), with its own
    device default: the C++ runner identical to the Python one and the host path, and
    nothing written beside ``--out``."""
    artifact = built_artifact("aoti", LANE)
    out = tmp_path / "check" / "cpp_check.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "cpp_runner_check.py"), str(artifact),
         "--tool", str(draft_cpp), "--repeats", "5", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, **({} if device.type == "cuda" else {"CUDA_VISIBLE_DEVICES": ""})})
    assert result.returncode == 0, result.stderr[-3000:]
    assert [p.name for p in out.parent.iterdir()] == ["cpp_check.json"]
    report = json.loads(out.read_text())
    assert report["device"] == device.type and report["replay_identical"]
    for row in report["buckets"].values():
        assert row["cpp_identical_to_python_runner"]
        assert (row["cpp_host_us"] is None) == (device.type == "cpu")


def flip_last_weight_byte(directory: Path) -> None:
    path = directory / ARTIFACT_WEIGHTS
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))


def edit_the_manifests_k(directory: Path) -> None:
    manifest = json.loads((directory / MANIFEST).read_text())
    manifest["lane"]["k"] += 1
    (directory / MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("damage", [flip_last_weight_byte, edit_the_manifests_k])
def test_the_cpp_runner_refuses_a_damaged_artifact_as_the_python_loader_does(
        draft_cpp, built_artifact, device, damage, tmp_path):
    artifact = built_artifact("aoti", LANE)
    rounds = tmp_path / "rounds.safetensors"
    record_rounds(artifact, rounds, device.type, 1)
    damaged = tmp_path / "damaged"
    shutil.copytree(artifact, damaged)
    damage(damaged)
    with pytest.raises(ArtifactError) as python:
        load_runner(damaged, device)
    result = draft_in_cpp(draft_cpp, damaged, rounds, tmp_path / "outputs.safetensors")
    assert result.returncode == 1
    assert result.stderr.strip() == f"dspark-draft-cpp: {python.value}"


def test_a_refused_round_names_its_input_as_python_does_and_changes_nothing(
        draft_cpp, built_artifact, device, tmp_path):
    """Refused: a prompt with a NaN in a valid row (by the compiled prefill's rules), by the
    step's rules each in turn (an anchor position below num_new or past the context, a
    negative temperature, a seed past 2^32, a bad anchor), narrow features (before any
    work), a round with no feature rows but a new one claimed. Drafted: a round with no
    feature rows and none claimed."""
    artifact = built_artifact("aoti", LANE)
    runner = load_runner(artifact, device)
    (bucket, batch, inputs), = plan(runner.lane, runner.buckets, ROUNDS, 24, SEED, 0.0,
                                    device.type)
    prompt = inputs[0]
    bad_prompt = dataclasses.replace(prompt, features=prompt.features.clone())
    bad_prompt.features[0, int(prompt.num_new[0]) - 1, 0] = float("nan")
    bad_anchor = dataclasses.replace(inputs[2], anchor=inputs[2].anchor.clone().fill_(-1))
    narrow = dataclasses.replace(inputs[3], features=inputs[3].features[..., 1:].contiguous())
    no_rows = dataclasses.replace(inputs[1], features=inputs[1].features[:, :0],
                                  num_new=torch.zeros_like(inputs[1].num_new))
    claims_a_row = dataclasses.replace(no_rows, num_new=torch.ones_like(no_rows.num_new))
    step = inputs[2]
    by_rule = [dataclasses.replace(step, anchor_pos=step.num_new - 1),
               dataclasses.replace(step, anchor_pos=torch.full_like(step.anchor_pos, 1 << 40)),
               dataclasses.replace(step, temperature=torch.full_like(step.anchor, -1.0,
                                                                     dtype=torch.float32)),
               dataclasses.replace(step, seed=torch.full_like(step.anchor, 1 << 33))]
    recorded = [bad_prompt, prompt, inputs[1], no_rows, *by_rule, bad_anchor, step, narrow,
                claims_a_row, *inputs[3:]]
    refused = {0: bad_prompt, 4: by_rule[0], 5: by_rule[1], 6: by_rule[2], 7: by_rule[3],
               8: bad_anchor, 10: narrow, 11: claims_a_row}  # by index
    rounds, outputs = tmp_path / "rounds.safetensors", tmp_path / "outputs.safetensors"
    save_rounds(rounds, [(bucket, batch, recorded)], device.type, {})
    result = draft_in_cpp(draft_cpp, artifact, rounds, outputs)
    assert result.returncode == 0, result.stderr

    with safe_open(str(outputs), framework="pt") as handle:
        errors = {key: value for key, value in handle.metadata().items()
                  if key.endswith(".error")}
    drafted = load_file(outputs)
    slots = [runner.admit() for _ in range(batch)]
    # a runner that never saw the refused rounds drafts what the C++ runner drafted after them
    for index, round_inputs in enumerate(recorded):
        if index not in refused:
            out = runner.draft(round_inputs, slots)
            assert torch.equal(out.ids, drafted[f"b{bucket}.r{index}.ids"]), index
            assert torch.equal(out.confidences, drafted[f"b{bucket}.r{index}.confidences"]), index
    fields = set()
    for index, round_inputs in refused.items():
        with pytest.raises(InputError) as python:
            runner.draft(round_inputs, slots)
        assert errors.pop(f"b{bucket}.r{index}.error") == str(python.value)
        assert f"b{bucket}.r{index}.ids" not in drafted
        fields.add(str(python.value).split(":")[0])
    assert not errors
    assert set(RULES) <= fields  # every rule of the step's, in both runtimes' words
