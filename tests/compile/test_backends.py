"""Each backend on both tiny lanes: build, then dspark-verify in a fresh process."""

import importlib.util

import onnx
import pytest
import torch._inductor.config

from dspark_compile.compile import build_artifact
from dspark_compile.compile.backends import REGISTRY, get_backend
from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import CONF_DIR, lane_config
from dspark_compile.draft import DraftStep
from dspark_compile.errors import ConfigError, MissingBackendError
from dspark_compile.tools.rounds import synthetic_rounds
from dspark_compile.runtime import load_runner

CPU_BACKENDS = ["eager", "inductor", "aoti", "onnx"]
HAS_TENSORRT = importlib.util.find_spec("torch_tensorrt") is not None


# Every backend on both tiny lanes, but aoti and inductor on tiny_d2t alone: a CPU build of
# either lowers each bucket afresh (a minute or more a bucket), and tiny_d2t's step holds all
# of tiny's plus d2t. Inductor's tiny artifact is the two-bucket one the runner tests load.
CASES = [(backend, lane) for backend in CPU_BACKENDS for lane in ("tiny", "tiny_d2t")
         if (backend, lane) not in (("aoti", "tiny"), ("inductor", "tiny"))]


@pytest.mark.parametrize("backend,lane_name", CASES)
def test_artifact_is_token_identical_in_a_fresh_process(built_artifact, fresh_verify, device,
                                                        backend, lane_name):
    """A mixed batch: one row samples at T = 1 with the counter-based noise, one drafts
    greedily, and the greedy row must meet near-ties (best two logits within one bf16
    epsilon), where a backend that rounds a logit differently would pick another token."""
    if device.type not in getattr(get_backend(backend), "DEVICES", ("cpu", "cuda")):
        pytest.skip(f"{backend} does not run on {device.type}")
    # onnx greedy only: its fp32 logits carry onnxruntime's summation order, and a sampled
    # row's float64 scores then flip where two candidates lie closer than that (seen on
    # tiny at round 14 of 24); greedy fp32 near-ties are rarer than a bf16 lane's
    temperature = 0.0 if backend == "onnx" else 1.0
    code, report, stderr = fresh_verify(built_artifact(backend, lane_name),
                                        f"temperature={temperature}", "rounds=24")
    assert code == 0, stderr
    assert report["identical"] and report["first_mismatch"] is None
    assert report["backend"] == backend and report["lane"] == lane_name
    assert report["rounds"] == 24 and report["buckets"] == [3]
    assert report["tokens_compared"] == 24 * 2 * 5  # 24 rounds, batch 2 in bucket 3, k=5
    if backend != "onnx":  # onnx runs an fp32 copy: ties are rare
        assert report["near_ties"] > 0


FUSED_ATTENTION_LANE = dict(fused_attention=True,
                            layer_types=["sliding_attention", "full_attention"],
                            sliding_window=20)
ON_CUDA_ONLY = "the attention kernel runs on CUDA (CPU lanes keep SDPA)"


@pytest.mark.parametrize("backend", ["eager", "inductor", "aoti"])
def test_artifacts_of_a_fused_attention_lane_are_token_identical(built_artifact, fresh_verify,
                                                                 device, backend):
    """The host path calls the attention kernel eagerly; inductor and aoti keep the same op
    inside their one graph and must draft the same bits."""
    if device.type != "cuda":
        pytest.skip(ON_CUDA_ONLY)
    artifact = built_artifact(backend, "tiny_d2t", **FUSED_ATTENTION_LANE)
    code, report, stderr = fresh_verify(artifact, "temperature=1.0", "rounds=12")
    assert code == 0, stderr
    assert report["identical"] and report["tokens_compared"] > 0


def test_an_inductor_runner_leaves_the_process_inductor_config_alone(built_artifact, device):
    """The backend's Inductor options hold for its own compile. Set for the whole process,
    they would change the bits of what Inductor compiles after it."""
    before = torch._inductor.config.get_config_copy()
    runner = load_runner(built_artifact("inductor", "tiny", buckets=(1, 3)), device)
    runner.draft(next(synthetic_rounds(runner.lane, 1, 20, 1, 0, device)), [runner.admit()])
    assert torch._inductor.config.get_config_copy() == before


def test_the_exported_step_calls_the_attention_kernel_in_place_of_sdpa(device,
                                                                        exported_targets):
    if device.type != "cuda":
        pytest.skip(ON_CUDA_ONLY)
    lane = lane_config("tiny_d2t", **FUSED_ATTENTION_LANE)
    targets = exported_targets(lane, device)
    assert targets.count(torch.ops.dspark.block_attention.default) == lane.num_layers
    assert not any("scaled_dot_product" in str(t) for t in targets)


def test_tensorrt_refuses_a_fused_attention_lane(tmp_path):
    step = DraftStep(random_drafter(lane_config("tiny", fused_attention=True), "cpu"))
    with pytest.raises(ConfigError, match="fused_attention=false"):
        get_backend("tensorrt").compile(step, {}, tmp_path)


def test_onnx_argmax_keeps_the_first_index_on_ties(built_artifact, device):
    if device.type != "cpu":
        pytest.skip("onnxruntime runs on the CPU here")
    model = onnx.load(str(built_artifact("onnx", "tiny_d2t") / "bucket3.onnx"))
    argmax = [n for n in model.graph.node if n.op_type == "ArgMax"]
    # the loop is unrolled and each step's argmax has two stages (draft.first_argmax)
    assert len(argmax) == 2 * lane_config("tiny_d2t").k
    for node in argmax:
        attributes = {a.name: a.i for a in node.attribute}
        assert attributes.get("select_last_index", 0) == 0


def test_unknown_backend_is_refused_with_the_known_ones():
    with pytest.raises(ConfigError, match="known backends"):
        get_backend("tvm")


def test_every_backend_config_selects_a_backend_that_compiles_and_loads():
    """A ``backend=<name>`` the configs offer is one ``get_backend`` finds, and the module
    it finds has the two functions the store and the runtime call."""
    offered = {path.stem for path in (CONF_DIR / "backend").glob("*.yaml")}
    assert offered == set(REGISTRY)
    for name in offered:
        backend = get_backend(name)
        assert callable(backend.compile) and callable(backend.load), name


@pytest.mark.skipif(HAS_TENSORRT, reason="torch_tensorrt is installed")
def test_tensorrt_without_the_package_says_how_to_install_it(tmp_path):
    backend = get_backend("tensorrt")
    with pytest.raises(MissingBackendError, match=r"pip install 'dspark-compile\[tensorrt\]'"):
        backend.compile(DraftStep(random_drafter(lane_config("tiny"), "cpu")), {}, tmp_path)
    with pytest.raises(MissingBackendError, match="Torch-TensorRT"):
        backend.load(tmp_path, None, [1])


@pytest.mark.skipif(not HAS_TENSORRT, reason="torch_tensorrt is not installed (optional "
                    "extra: pip install 'dspark-compile[tensorrt]')")
def test_tensorrt_artifact_is_token_identical(built_artifact, fresh_verify, device):
    if device.type != "cuda":
        pytest.skip("TensorRT runs on CUDA GPUs only")
    code, report, stderr = fresh_verify(built_artifact("tensorrt", "tiny"))
    assert code == 0 and report["identical"], stderr


def test_backend_on_a_device_it_does_not_run_on_is_refused(tmp_path):
    drafter = random_drafter(lane_config("tiny"), "cpu")
    with pytest.raises(ConfigError, match="runs on cuda"):
        build_artifact(drafter, "tensorrt", [1], tmp_path)


def test_a_saved_inductor_step_refuses_a_module_whose_constants_differ(tmp_path):
    """The backend's guard filter drops Dynamo's guards on module tensors, not those on
    module constants: a step saved with ``with_probs`` off, loaded onto a module with it on,
    must refuse to run rather than run the other step's graph; with the same constant it
    runs, on the module's own weights."""
    class Step(torch.nn.Module):
        def __init__(self, with_probs: bool):
            super().__init__()
            self.proj, self.with_probs = torch.nn.Linear(4, 4), with_probs

        def forward(self, x):
            y = self.proj(x)
            return (y, y.softmax(-1)) if self.with_probs else (y,)

    saved = get_backend("inductor").aot_compiled(Step(False).forward, (torch.ones(4),))
    saved.save_compiled_function(str(tmp_path / "step.bin"), external_data={"step": Step(False)})
    for flag in (False, True):
        step = Step(flag)
        with open(tmp_path / "step.bin", "rb") as f:
            loaded = torch.compiler.load_compiled_function(f, external_data={"step": step})
        if flag:
            with pytest.raises(RuntimeError, match="with_probs"), torch.no_grad():
                loaded(step, torch.ones(4))
        else:
            with torch.no_grad():
                (out,) = loaded(step, torch.ones(4))
            torch.testing.assert_close(out, step.proj(torch.ones(4)), rtol=0, atol=0)


LOAD_AND_DRAFT = """
import sys
from dspark_compile.compile.backends.inductor import (TRITON_FOLDER, inductor_cache,
                                                      mapped_libraries, triton_caches)
from dspark_compile.runtime import load_runner
from dspark_compile.tools.rounds import synthetic_rounds
runner = load_runner(sys.argv[1], sys.argv[2])
runner.draft(next(synthetic_rounds(runner.lane, 1, 24, 1, 0, sys.argv[2])), [runner.admit()])
cache = inductor_cache()
for path in sorted(mapped_libraries()):
    for root in triton_caches():
        if path.is_relative_to(root):
            print(TRITON_FOLDER + "/" + path.relative_to(root).as_posix())
    if path.is_relative_to(cache) and path.relative_to(cache).parts[0] != "triton":
        print(path.relative_to(cache).as_posix())
"""


def test_an_inductor_artifact_loads_with_every_kernel_from_its_bundle(built_artifact, device,
                                                                      tmp_path):
    """A fresh process with empty Inductor and Triton caches runs the step on kernels and
    Triton launchers from the artifact's bundle only: one compiled again would be one the
    bundle lacks."""
    import os
    import subprocess
    import sys
    import tarfile

    from dspark_compile.compile.backends.inductor import KERNELS

    artifact = built_artifact("inductor", "tiny", buckets=(1, 3))
    with tarfile.open(artifact / KERNELS) as tar:
        bundled = {member.name for member in tar.getmembers()}
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor-cache"),
               TRITON_CACHE_DIR=str(tmp_path / "triton-cache"))
    result = subprocess.run([sys.executable, "-c", LOAD_AND_DRAFT, str(artifact), device.type],
                            capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = set(result.stdout.split())
    if device.type == "cpu":
        assert loaded  # Inductor's CPU kernels are C++ libraries
    else:
        assert any(name.startswith("triton-cache/") for name in loaded)  # its launchers
    assert loaded <= bundled


def test_bundled_launchers_unpack_where_inductor_points_triton(tmp_path, monkeypatch):
    """A ``triton-cache/`` member lands where Inductor's own ``triton_cache_dir`` says
    Triton looks for the device's files, Inductor's kernels in Inductor's cache, and a
    member that climbs out of them is refused."""
    import io
    import tarfile
    from pathlib import Path

    from torch._inductor.runtime.cache_dir_utils import triton_cache_dir

    from dspark_compile.compile.backends.inductor import unpack_kernels

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)

    def tar_of(*names: str):
        path = tmp_path / f"{len(list(tmp_path.iterdir()))}.tar"
        with tarfile.open(path, "w") as tar:
            for name in names:
                info = tarfile.TarInfo(name)
                info.size = len(name)
                tar.addfile(info, io.BytesIO(name.encode()))
        return path

    unpack_kernels(tar_of("triton-cache/KEY/launcher.so", "ab/kernel.so"),
                   torch.device("cuda", 1))
    launcher = Path(triton_cache_dir(1)) / "KEY" / "launcher.so"
    assert launcher.read_text() == "triton-cache/KEY/launcher.so"
    assert (tmp_path / "inductor" / "ab" / "kernel.so").read_text() == "ab/kernel.so"
    with pytest.raises(RuntimeError, match="unexpected member"):
        unpack_kernels(tar_of("triton-cache/../../evil.so"), torch.device("cuda", 0))
