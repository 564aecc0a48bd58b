"""Each backend on both tiny lanes: build, then dspark-verify in a fresh process."""

import importlib.util
import inspect
import sys
import types

import onnx
import pytest
import torch

from dspark_compile.compile import build_artifact
from dspark_compile.compile.backends import REGISTRY, Backend, get_backend
from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import CONF_DIR, lane_config
from dspark_compile.draft import DraftStep
from dspark_compile.runtime import load_runner
from dspark_compile.tools.rounds import synthetic_rounds
from dspark_compile.errors import ConfigError, MissingBackendError

CPU_BACKENDS = ["eager", "inductor", "aoti", "onnx"]
HAS_TENSORRT = importlib.util.find_spec("torch_tensorrt") is not None


# Every backend on both tiny lanes. Inductor's tiny_d2t is the two-bucket artifact its own
# and the runner's tests load.
CASES = [(backend, lane, (1, 3) if (backend, lane) == ("inductor", "tiny_d2t") else (3,))
         for backend in CPU_BACKENDS for lane in ("tiny", "tiny_d2t")]
REQUESTS = {(3,): 2, (1, 3): 1 + 2}  # dspark-verify drafts for b - 1 requests in bucket b > 1


@pytest.mark.parametrize("backend,lane_name,buckets", CASES)
def test_artifact_is_token_identical_in_a_fresh_process(built_artifact, fresh_verify, device,
                                                        backend, lane_name, buckets):
    """A mixed batch: one row samples at T = 1 with the counter-based noise, one drafts
    greedily, and the greedy row must meet near-ties (best two logits within one bf16
    epsilon), where a backend that rounds a logit differently would pick another token."""
    if device.type not in getattr(get_backend(backend), "DEVICES", ("cpu", "cuda")):
        pytest.skip(f"{backend} does not run on {device.type}")
    # onnx greedy only: its fp32 logits carry onnxruntime's summation order, and a sampled
    # row's float64 scores then flip where two candidates lie closer than that (seen on
    # tiny at round 14 of 24); greedy fp32 near-ties are rarer than a bf16 lane's
    temperature = 0.0 if backend == "onnx" else 1.0
    code, report, stderr = fresh_verify(built_artifact(backend, lane_name, buckets=buckets),
                                        f"temperature={temperature}", "rounds=24")
    assert code == 0, stderr
    assert report["identical"] and report["first_mismatch"] is None
    assert report["backend"] == backend and report["lane"] == lane_name
    assert report["rounds"] == 24 and report["buckets"] == list(buckets)
    assert report["tokens_compared"] == 24 * REQUESTS[buckets] * 5  # 24 rounds a bucket, k=5
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


def test_the_exported_step_calls_the_attention_kernel_in_place_of_sdpa(device,
                                                                        exported_targets):
    if device.type != "cuda":
        pytest.skip(ON_CUDA_ONLY)
    lane = lane_config("tiny_d2t", **FUSED_ATTENTION_LANE)
    targets = exported_targets(lane, device)
    assert targets.count(torch.ops.dspark.block_attention.default) == lane.num_layers
    assert not any("scaled_dot_product" in str(t) for t in targets)


NO_HEADS = dict(markov_rank=0, confidence_head=False, confidence_with_markov=False)


@pytest.mark.parametrize("backend", ["eager", "inductor", "aoti"])
def test_artifacts_of_a_drafter_without_heads_are_token_identical(built_artifact, fresh_verify,
                                                                  device, backend):
    """No Markov head (the ids are the base argmax) and no confidence head: the runner
    returns no confidences, and the ids are the host path's."""
    artifact = built_artifact(backend, "tiny_d2t", **NO_HEADS)
    code, report, stderr = fresh_verify(artifact, "temperature=1.0", "rounds=12")
    assert code == 0, stderr
    assert report["identical"] and report["tokens_compared"] > 0
    runner = load_runner(artifact, device=str(device))
    inputs = next(iter(synthetic_rounds(runner.lane, 2, 16, 1, seed=0, device=str(device))))
    out = runner.draft(inputs, [runner.admit() for _ in range(2)])
    assert out.confidences is None and out.ids.shape == (2, runner.lane.k)


# gate|up and the lm_head 4096 features wide: enough 64-feature tiles for the skinny GEMM
SKINNY_LANE = dict(skinny_gemm=True, intermediate_size=2048, target_vocab_size=4096,
                   draft_vocab_size=4096, mask_token_id=4095)


@pytest.mark.parametrize("backend", ["eager", "inductor", "aoti"])
def test_artifacts_of_a_skinny_gemm_lane_are_token_identical(built_artifact, fresh_verify,
                                                             device, backend):
    """Bucket 1 (5 block rows): the host path runs the skinny GEMM eagerly for gate|up and
    the lm_head; inductor and aoti keep the op in their graph and must draft the same
    bits."""
    if device.type != "cuda":
        pytest.skip("the skinny GEMM runs on CUDA (CPU lanes keep F.linear)")
    artifact = built_artifact(backend, "tiny", buckets=(1,), **SKINNY_LANE)
    code, report, stderr = fresh_verify(artifact, "temperature=1.0", "rounds=12")
    assert code == 0, stderr
    assert report["identical"] and report["tokens_compared"] > 0


@pytest.mark.parametrize("field", ["fused_attention", "skinny_gemm"])
def test_tensorrt_refuses_a_lane_with_a_kernel_of_our_own(tmp_path, field):
    step = DraftStep(random_drafter(lane_config("tiny", **{field: True}), "cpu"))
    with pytest.raises(ConfigError, match=f"{field}=false"):
        get_backend("tensorrt").compile_bucket(step, 1, (), tmp_path)


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


def test_every_backend_config_selects_a_backend_with_the_declared_interface():
    """A ``backend=<name>`` the configs offer is one ``get_backend`` finds, and each of the
    module's functions takes the arguments :class:`Backend` declares, by name."""
    offered = {path.stem for path in (CONF_DIR / "backend").glob("*.yaml")}
    assert offered == set(REGISTRY)
    declared = {name: list(inspect.signature(function).parameters)[1:]  # without self
                for name, function in vars(Backend).items() if inspect.isfunction(function)
                and not name.startswith("_")}
    assert set(declared) == {"compile_bucket", "finish", "prepare", "load"}
    for name in offered:
        backend = get_backend(name)
        for function, parameters in declared.items():
            assert list(inspect.signature(getattr(backend, function)).parameters) == \
                parameters, (name, function)


def test_a_backend_module_lacking_a_member_is_refused_by_name(monkeypatch):
    module = types.ModuleType("half_a_backend")
    module.load = lambda out_dir, step, buckets: {}
    monkeypatch.setitem(sys.modules, "half_a_backend", module)
    monkeypatch.setitem(REGISTRY, "half", "half_a_backend")
    with pytest.raises(TypeError, match="lacks DEVICES, DTYPE, INSTALL, LOADS_WITHOUT_WEIGHTS, "
                                        "NEEDS, compile_bucket, finish, prepare"):
        get_backend("half")


@pytest.mark.skipif(HAS_TENSORRT, reason="torch_tensorrt is installed")
def test_tensorrt_without_the_package_says_how_to_install_it(tmp_path):
    backend = get_backend("tensorrt")
    with pytest.raises(MissingBackendError, match=r"pip install 'dspark-compile\[tensorrt\]'"):
        backend.compile_bucket(DraftStep(random_drafter(lane_config("tiny"), "cpu")), 1, (),
                               tmp_path)
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
