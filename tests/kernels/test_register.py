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
