"""Where the kernels' ops register (``dspark_compile/kernels/__init__.py``)."""

import os
import subprocess
import sys

import pytest

from dspark_compile import kernels


@pytest.mark.skipif(not kernels.HAS_TRITON, reason="Triton is not installed (the CPU wheels "
                    "of torch come without it)")
def test_the_ops_register_where_they_first_run_not_at_import():
    """``triton_op`` imports Inductor and Dynamo: a process that only loads an ``aoti``
    artifact must not pay for them on ``import dspark_compile``."""
    state = ("print('torch._inductor' in sys.modules, hasattr(torch.ops.dspark, 'markov_walk'), "
             "hasattr(torch.ops.dspark, 'block_attention'))\n")
    script = ("import sys, torch, dspark_compile\n"
              "from dspark_compile import kernels\n"
              "assert kernels.RUNNABLE\n" + state + "kernels.register()\n" + state)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env=dict(os.environ, TRITON_INTERPRET="1"), timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["False"] * 3 + ["True"] * 3


@pytest.mark.skipif(not kernels.HAS_TRITON, reason="Triton is not installed (the CPU wheels "
                    "of torch come without it)")
def test_no_kernel_parameter_has_a_default():
    """Inductor's launcher for a kernel in the graph counts only the arguments a call passes
    (torch 2.11): a defaulted constexpr left out shifts the grid into the arguments and
    the artifact's build fails on CUDA, never on the CPU. Every call passes everything."""
    import importlib
    import inspect
    import pkgutil

    import triton

    found, defaulted = [], []
    for module in pkgutil.walk_packages(kernels.__path__, kernels.__name__ + "."):
        for name, value in vars(importlib.import_module(module.name)).items():
            if isinstance(value, triton.runtime.jit.KernelInterface):  # jit or interpreted
                found.append(name)
                defaulted += [(name, p.name) for p in inspect.signature(value.fn).parameters
                              .values() if p.default is not inspect.Parameter.empty]
    assert len(found) >= 5  # the walk: the kernels were found
    assert defaulted == []
