"""The inductor backend's own parts: its guard filter, its process-wide config left alone,
its bundle (the kernels and launchers a fresh process would otherwise compile again) and
its kernels saved on the configs the build timed."""

import mmap
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch
import torch._inductor.config

from dspark_compile.compile.backends import get_backend
from dspark_compile.compile.backends.inductor import (KERNELS, kernels_on_timed_configs,
                                                      mapped_libraries, unpack_kernels)
from dspark_compile.runtime import load_runner
from dspark_compile.tools.rounds import synthetic_rounds


def test_an_inductor_runner_leaves_the_process_inductor_config_alone(built_artifact, device):
    """The backend's Inductor options hold for its own compile. Set for the whole process,
    they would change the bits of what Inductor compiles after it."""
    before = torch._inductor.config.get_config_copy()
    runner = load_runner(built_artifact("inductor", "tiny_d2t", buckets=(1, 3)), device)
    runner.draft(next(synthetic_rounds(runner.lane, 1, 20, 1, 0, device)), [runner.admit()])
    assert torch._inductor.config.get_config_copy() == before


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

    torch.manual_seed(0)
    traced = Step(False)
    saved = get_backend("inductor").aot_compiled(traced.forward, (torch.ones(4),))
    saved.save_compiled_function(str(tmp_path / "step.bin"), external_data={"step": traced})
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
            # its own weights (Inductor's CPU GEMM may round the last bit otherwise than
            # eager's), not the traced module's
            torch.testing.assert_close(out, step.proj(torch.ones(4)), rtol=0, atol=1e-6)
            assert not torch.allclose(out, traced.proj(torch.ones(4)), atol=1e-3)


def test_an_inductor_artifact_drafts_the_host_path_tokens_with_another_thread_count(
        built_artifact, device):
    """Dynamo guards the process's global state, its thread count among it, as it was when
    the step was traced; an engine sets its own. In a process with one thread more than the
    build had, the artifact loads and drafts the host path's tokens (dspark-verify's check)."""
    artifact = built_artifact("inductor", "tiny_d2t", buckets=(1, 3))
    script = ("import sys, torch; torch.set_num_threads(int(sys.argv[2]))\n"
              "from dspark_compile.tools.verify import verify_artifact\n"
              "print(verify_artifact(sys.argv[1], sys.argv[3])['identical'])")
    result = subprocess.run([sys.executable, "-c", script, str(artifact),
                             str(torch.get_num_threads() + 1), device.type],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-1] == "True"


LOAD_AND_DRAFT = """
import importlib.util, sys
compiled = []  # the kernels Triton compiles (or finds in its cache) in this process
if importlib.util.find_spec("triton"):  # CPU wheels of torch lack it
    import triton
    triton_compile = triton.compile
    triton.compile = lambda src, *args, **kw: (compiled.append(src.fn.__name__)
                                              or triton_compile(src, *args, **kw))
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
from torch._dynamo.utils import compilation_time_metrics  # what Inductor timed in this process
print(len(compilation_time_metrics.get("CachingAutotuner.benchmark_all_configs", [])))
print(",".join(compiled) or "-")
"""


def test_an_inductor_artifact_loads_with_every_kernel_from_its_bundle(built_artifact, device,
                                                                      tmp_path):
    """A fresh process with empty Inductor and Triton caches runs the step on kernels from
    the artifact only: on a CPU Inductor's C++ kernels from its bundle (one compiled again
    would be one the bundle lacks); on a GPU each of Inductor's Triton kernels launched
    from the binary its saved function holds (``triton.compile`` called for none of them,
    not even to find it in Triton's cache; only for our own), on the config the build
    timed: the load times no kernel's candidate configs. On a GPU the build's own caches
    are gone by then (a saved kernel of several configs would find its choice there)."""
    if device.type == "cuda":
        artifact = built_artifact("inductor", "tiny_d2t", buckets=(1, 3),
                                  caches=tmp_path / "build")
        shutil.rmtree(tmp_path / "build" / "inductor")
        shutil.rmtree(tmp_path / "build" / "triton")
    else:
        artifact = built_artifact("inductor", "tiny_d2t", buckets=(1, 3))
    with tarfile.open(artifact / KERNELS) as tar:
        bundled = {member.name for member in tar.getmembers()}
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor-cache"),
               TRITON_CACHE_DIR=str(tmp_path / "triton-cache"))
    result = subprocess.run([sys.executable, "-c", LOAD_AND_DRAFT, str(artifact), device.type],
                            capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    *names, autotuned, compiled = result.stdout.split()
    loaded = set(names)
    if device.type == "cpu":
        assert loaded  # Inductor's CPU kernels are C++ libraries
    else:
        assert autotuned == "0"
        assert not [name for name in compiled.split(",") if name.startswith("triton_")]
    assert loaded <= bundled


def test_a_library_replaced_after_it_was_mapped_is_still_listed(tmp_path):
    """A launcher this process mapped, which another build then put into the shared cache
    again (a rename over it): the kernel lists the mapping as "(deleted)", and the file
    under that name is still bundled."""
    library = tmp_path.resolve() / "launcher.so"
    library.write_bytes(bytes(4096))
    with open(library, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ):
        (tmp_path / "again.so").write_bytes(bytes(4096))
        os.replace(tmp_path / "again.so", library)
        assert library in mapped_libraries()


def test_bundled_launchers_unpack_where_inductor_points_triton(tmp_path, monkeypatch):
    """A ``triton-cache/`` member lands where Inductor's own ``triton_cache_dir`` says
    Triton looks for the device's files, Inductor's kernels in Inductor's cache, and a
    member that climbs out of them is refused."""
    import io

    from torch._inductor.runtime.cache_dir_utils import triton_cache_dir

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


# A kernel as Inductor writes one: its candidate configs from the heuristics' decorator,
# its file in Inductor's cache named by the hash of its source.
KERNEL_SOURCE = """
import torch
import triton
import triton.language as tl
from torch._inductor.runtime import triton_heuristics
from torch._inductor.runtime.hints import DeviceProperties

@triton_heuristics.pointwise(
    size_hints={"x": 4096}, filename=__file__, min_elem_per_thread=0,
    triton_meta={"signature": {"x": "*fp32", "xnumel": "i32", "XBLOCK": "constexpr"},
                 "device": DeviceProperties.create(torch.device("cpu")), "constants": {},
                 "configs": []},
    inductor_meta={"kernel_name": "kernel"})
@triton.jit
def kernel(x, xnumel, XBLOCK: tl.constexpr):
    pass
"""


def test_a_kernel_compiled_again_after_its_choice_holds_that_one_config(tmp_path, monkeypatch):
    """What the build's second compile of a bucket rests on: a kernel whose timed config
    Inductor's own autotune cache stored, loaded again under :func:`kernels_on_timed_configs`,
    holds that one config, so its saved copy has nothing to look up or time at a load;
    without it, the process keeps the kernel of every candidate. The cache in use is back
    afterwards."""
    pytest.importorskip("triton", reason="Triton autotunes Inductor's GPU kernels only")
    from torch._inductor.codecache import PyCodeCache

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    built = PyCodeCache.load(KERNEL_SOURCE).kernel
    assert len(built.configs) > 1
    built.save_cache_hook(built.configs[-1], 0)  # what Triton's first call stores
    assert PyCodeCache.load(KERNEL_SOURCE).kernel is built
    with kernels_on_timed_configs(torch.device("cpu")):
        again = PyCodeCache.load(KERNEL_SOURCE).kernel
    assert again.autotune_cache_info["autotune_cache_state"] == "hit"
    assert [config.kwargs for config in again.configs] == [built.configs[-1].kwargs]
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path)
