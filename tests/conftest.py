import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dspark_compile.checkpoint import random_drafter
from dspark_compile.draft import DraftStep, KVCache
from dspark_compile.draft import HostPath
from dspark_compile.tools.rounds import context_needed, synthetic_rounds

# DSPARK_TEST_DEVICE=cuda runs the same tests on a GPU
DEVICE = torch.device(os.environ.get("DSPARK_TEST_DEVICE", "cpu"))


@pytest.fixture
def device() -> torch.device:
    return DEVICE


def run_both_paths(drafter, batch: int, context: int, rounds: int, seed: int, step=None,
                   temperature: float = 0.0):
    """Yield (device-path ids, confidences), host-path result, per seeded round.

    ``step(k_cache, v_cache, *inputs)`` is the device path; default: the eager draft step.
    Both paths start from the same zeroed cache and see the same rounds.
    """
    lane, device = drafter.lane, drafter.fc.weight.device
    step = DraftStep(drafter) if step is None else step
    cache = KVCache.allocate(lane, batch, device, context_needed(lane, context, rounds))
    host_cache = cache.clone()
    host = HostPath(drafter)
    with torch.no_grad():
        for inputs in synthetic_rounds(lane, batch, context, rounds, seed, device, temperature):
            ids, confidences = step(cache.k, cache.v, *inputs.tensors())[:2]
            yield (ids, confidences), host.draft(host_cache, inputs)


@pytest.fixture
def both_paths():
    return run_both_paths


def export_targets(lane, device, requests: int = 3) -> list:
    """What the draft step of a seeded ``lane`` calls for ``requests`` prompts of up to 40
    rows, as ``torch.export`` (non-strict) records it: the targets of the exported graph's
    call_function nodes."""
    step = DraftStep(random_drafter(lane, device, seed=0))
    inputs = next(iter(synthetic_rounds(lane, requests, 40, 1, 0, device, 1.0))).tensors()
    cache = KVCache.allocate(lane, requests, device, 64)
    with torch.no_grad():
        program = torch.export.export(step, (cache.k, cache.v, *inputs), strict=False)
    return [n.target for n in program.graph.nodes if n.op == "call_function"]


@pytest.fixture
def exported_targets():
    return export_targets


BUILD = """
import json, sys
from dspark_compile.compile import build_artifact
from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import lane_config
backend, lane, overrides, root, device, *buckets = sys.argv[1:]
drafter = random_drafter(lane_config(lane, **json.loads(overrides)), device, seed=0)
print(build_artifact(drafter, backend, [int(b) for b in buckets], root)[0])
"""


@pytest.fixture(scope="session")
def built_artifact(tmp_path_factory):
    """``built_artifact(backend, lane_name, buckets=(3,), caches=None, **lane_overrides)``:
    built once per session, seed 0; with ``caches`` (a folder) by a build whose Inductor
    and Triton caches are ``caches/inductor`` and ``caches/triton`` (empty at first), into
    ``caches/artifacts``, where a build of the same key elsewhere is not found.

    Each build runs in a fresh process, as ``dspark-compile`` does: a CPU AOTInductor
    build inside the test process took about 570 s against 85 s in a fresh one. pytest-xdist's
    workers share one artifact root: the store's lock makes a second builder of a key wait
    and reuse the first one's artifact (tests that damage one copy it first).
    """
    base = tmp_path_factory.getbasetemp()
    shared_root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "artifacts"
    shared_root.mkdir(exist_ok=True)
    built = {}

    def get(backend: str, lane_name: str, buckets=(3,), caches: Path | None = None,
            **lane_overrides):
        overrides = json.dumps(lane_overrides, sort_keys=True)
        key = (backend, lane_name, overrides, tuple(buckets), caches)
        root, env = shared_root, os.environ
        if caches is not None:
            root = caches / "artifacts"
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(caches / "inductor"),
                       TRITON_CACHE_DIR=str(caches / "triton"))
        if key not in built:
            result = subprocess.run(
                [sys.executable, "-c", BUILD, backend, lane_name, overrides, str(root),
                 str(DEVICE), *map(str, buckets)], capture_output=True, text=True,
                timeout=1200, env=env)
            assert result.returncode == 0, result.stderr[-3000:]
            built[key] = Path(result.stdout.strip().splitlines()[-1])
        return built[key]
    return get


# NumPy 2.4 refuses int() of a one-element array, which Triton 3.6's interpreter takes of
# a loop bound loaded from memory; the GPU compiler never does.
INTERPRETER_SHIM = """
from triton.runtime import interpreter
_patch = interpreter._patch_lang_tensor
def _patch_with_index(tensor, scope):
    _patch(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))
interpreter._patch_lang_tensor = _patch_with_index
"""


@pytest.fixture
def interpreted():
    """``interpreted(script, *argv)``: the script in a fresh process whose Triton kernels
    run in Triton's interpreter on the CPU; the finished ``subprocess.CompletedProcess``."""
    def run(script: str, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", INTERPRETER_SHIM + script, *argv],
                              env=dict(os.environ, TRITON_INTERPRET="1"), capture_output=True,
                              text=True, timeout=600)
    return run


@pytest.fixture
def interpreted_report(interpreted):
    """``interpreted_report(script, *argv)``: the JSON the script, run as ``interpreted``
    runs it, prints last. Torch before 2.13 (the GPU machine's 2.11) has a ``wrap_triton``
    that refuses interpreted kernels: there the CUDA tests check the kernels instead; from
    2.13 on (CI's) they run or fail."""
    if tuple(int(part) for part in torch.__version__.split(".")[:2]) < (2, 13):
        pytest.skip(f"torch {torch.__version__}'s wrap_triton refuses Triton's interpreted "
                    "kernels (2.13 runs them); the CUDA tests check the kernels here")

    def run(script: str, *argv: str):
        result = interpreted(script, *argv)
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(result.stdout.strip().splitlines()[-1])
    return run


@pytest.fixture
def ptxas_for_h200(tmp_path):
    """``ptxas_for_h200(kernel, pointers, aligned, constants, warps, stages)``: the Triton
    kernel compiled ahead of time for sm_90 with the ptxas Triton ships (no GPU needed),
    its pointer arguments typed by ``pointers`` (the others 32-bit integers), ``aligned``
    arguments known to be multiples of 16 (as Triton's launcher specializes them), its
    constexprs from ``constants``; the finished ptxas ``-v`` run."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    def compile_(kernel, pointers: dict, aligned: list, constants: dict, warps: int,
                 stages: int) -> subprocess.CompletedProcess:
        names = kernel.arg_names
        constexprs = {p.name for p in kernel.params if p.is_constexpr}
        signature = {n: "constexpr" if n in constexprs else pointers.get(n, "i32")
                     for n in names}
        source = ASTSource(fn=kernel, signature=signature,
                           attrs={(names.index(n),): [["tt.divisibility", 16]] for n in aligned},
                           constexprs={n: constants[n] for n in constexprs})
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                  options=dict(num_warps=warps, num_stages=stages))
        ptx = tmp_path / f"{kernel.__name__}.ptx"
        ptx.write_text(compiled.asm["ptx"])
        ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
        return subprocess.run([str(ptxas), "--gpu-name", "sm_90a", "-v", str(ptx), "-o",
                               str(tmp_path / "kernel.cubin")], capture_output=True, text=True)
    return compile_


@pytest.fixture
def h200_specializations(monkeypatch):
    """``h200_specializations(module, name, launch)``: the kernel ``module.<name>`` as
    Triton's launcher would specialize it for sm_90 (no GPU needed), one
    ``(constexprs, specialization)`` per launch that ``launch()`` makes through the
    package's own launcher (the kernel itself does not run). A new specialization is a
    new compile."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    def record(module, name: str, launch) -> list[tuple[dict, str]]:
        kernel = getattr(module, name)
        specialize = create_function_from_signature(kernel.signature, kernel.params,
                                                    make_backend(GPUTarget("cuda", 90, 32)))
        launches = []

        class Recorder:  # kernel[grid](*args, **kwargs), recorded
            def __getitem__(self, grid):
                return lambda *args, **kwargs: launches.append((args, kwargs))
        with monkeypatch.context() as patch:
            patch.setattr(module, name, Recorder())
            launch()
        return [(kwargs, str(specialize(*args, **kwargs)[1])) for args, kwargs in launches]
    return record


@pytest.fixture
def fresh_verify():
    return run_verify


def run_verify(artifact, *overrides):
    """dspark-verify in a fresh process: (exit code, its JSON report or None, stderr)."""
    result = subprocess.run([sys.executable, "-m", "dspark_compile", "verify", f"artifact={artifact}",
                             f"device={DEVICE.type}", *overrides],
                            capture_output=True, text=True, timeout=600)
    lines = result.stdout.strip().splitlines()
    report = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
    return result.returncode, report, result.stderr


# Files that take minutes on a 2-core CI machine (each lowers for the CPU, or builds the
# artifacts other files share), in the order they should start: the two workers of
# ``--dist loadfile`` take files in collection order (with xdist's reordering off), so a
# long file collected last would run alone at the end.
LONGEST_FIRST = ("test_two_commands.py", "tools/test_cli.py", "compile/test_backends.py",
                 "runtime/test_runner.py", "speculative/test_loop.py")


def pytest_configure(config):
    config.option.loadscopereorder = False  # else xdist starts the files of most tests first


def pytest_collection_modifyitems(items):
    def rank(item):
        path = item.path.as_posix()
        return next((i for i, name in enumerate(LONGEST_FIRST) if path.endswith(name)),
                    len(LONGEST_FIRST))
    items.sort(key=rank)  # stable: the order within a file, and of the rest, is kept
