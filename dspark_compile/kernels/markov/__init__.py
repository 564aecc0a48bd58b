"""The k-step Markov walk (vanilla head, bf16) in Triton: the op ``dspark::markov_walk``.

Two kernels, one arithmetic. Where W2 is larger than the GPU's shared memory (the 27B
lane's 127 MB) each step is one launch (``_markov_step_kernel``) that streams W2: its
programs split the draft vocabulary into runs of tiles, and the last program to finish
(an atomic count) reduces the programs' bests and writes the id the next launch reads as
its ``prev``. Odd steps walk each run backwards, so that a step starts on the tiles the
step before ended with, which are still in L2. Where W2 fits (the 35B-A3B lane's 16 MB
over 125 programs) one launch walks all k steps (``_markov_walk_kernel``): each program
reads its tile of W2 once and keeps it in shared memory, and between steps every program
waits until all have published their bests, then reduces them itself.

Per tile, a program multiplies the ``W1[prev]`` rows it gathered once against the tile of
W2 on the tensor cores, rounds the bias to bf16, adds the step's base row and rounds again
(a bf16 ``+``). Greedy rows compare the bf16 values in fp32, exactly: a streaming program
keeps the best value and first column of each of a tile's column slots, elementwise, and
reduces across the slots once, after its run of tiles. Sampled rows (T > 0) score
``z / T + G`` in float64 as the reference does, but only where it can matter: one pass
over an fp32 estimate of every column's score finds the tile's leader, the runner-up and
so whether the leader is alone, and whether the tile can beat the best so far at all;
only then is the leader scored in float64, or every column of a tile whose estimates
leave two contenders. The reduction over programs lets the lowest index win ties as
:func:`dspark_compile.draft.sampling.first_argmax` does and maps the id through
d2t. No ``[R, V]`` row is written, and only ``[R, k]`` target ids leave the op.

The certified walk (``dspark::certified_markov_walk``) is the streamed step with
``CERTIFIED`` on (``bounds.py``). Before the walk, one pass over the base logits gives
each request's and step's tile maxima and a few candidate columns (the argument:
:mod:`dspark_compile.draft.certified`). Each step then scores the candidates exactly, the
best of them being a score the step reaches, and bounds each of the program's tiles from
its maxima and the norms of W2's rows: no grid barrier, every program computes the same
least score. A program reads only the tiles whose bound reaches it, and in them only the
columns whose own bound does, or, where more than 3 in 4 of its tiles can, its whole run as
the full walk does. It returns the rows of W2 each step read.

``torch.library.triton_op`` lets ``torch.compile``, ``torch.export`` and AOTInductor see
the kernel and keep it inside their graphs; its fake implementation comes from tracing.
Off CUDA the walk stays :func:`dspark_compile.draft.markov.markov_loop`, the reference this
kernel is tested against.

Arithmetic: the bias is summed in fp32 like cuBLAS's bf16 GEMV, but in the tensor cores'
order, so its bf16 rounding can differ from the reference's in rare elements (two fp32
orders disagreed on about 7 in 100,000 on random weights); a token changes only where such
an element decides a near-tie. The benchmark and dspark-verify report the near-ties they meet.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from dspark_compile.kernels import RUNNABLE, register
from dspark_compile.kernels.markov import launch  # noqa: F401  (the launch shapes)


def markov_walk(w1: Tensor, w2: Tensor, base: Tensor, anchor: Tensor, temperature: Tensor,
                seed: Tensor, anchor_pos: Tensor, d2t: Optional[Tensor]) -> Tensor:
    """Target ids ``[R, k]`` of the k vanilla Markov steps from ``anchor`` over the base
    logits ``base [R, k, V]`` (see the module docstring)."""
    if not RUNNABLE:
        raise RuntimeError("the fused Markov step needs Triton on CUDA: pip install triton")
    register()
    return torch.ops.dspark.markov_walk(w1, w2, base, anchor, temperature, seed, anchor_pos,
                                        d2t)


def certified_markov_walk(w1: Tensor, w2: Tensor, norms: Tensor, base: Tensor,
                          anchor: Tensor, temperature: Tensor, seed: Tensor,
                          anchor_pos: Tensor, d2t: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """:func:`markov_walk`'s ids, and the rows of W2 each step read ``[k]``: a streamed
    step reads W2 only where a column can still win (see the module docstring)."""
    if not RUNNABLE:
        raise RuntimeError("the fused Markov step needs Triton on CUDA: pip install triton")
    register()
    return torch.ops.dspark.certified_markov_walk(w1, w2, norms, base, anchor, temperature,
                                                  seed, anchor_pos, d2t)
