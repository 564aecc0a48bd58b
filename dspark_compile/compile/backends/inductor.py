"""``torch.compile`` with reduce-overhead's options per bucket; the compiled kernels travel as
Inductor's cache artifacts, so a fresh process skips Inductor and Triton code generation."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
import torch._inductor
from torch import Tensor

from dspark_compile.draft import DraftStep
from dspark_compile import progress

PAYLOAD = "inductor_cache.bin"
OWN_CUDA_GRAPH = True  # reduce-overhead records and replays its own graph


def guards_kept(entries: list) -> list[bool]:
    """Dynamo's guards worth their time on each call: those on the step's inputs (shapes
    pick the bucket's entry) and on the Python constants of its modules (``with_probs``,
    the lane's fields: they choose the graph, so two steps in one process never share
    one). Not those on the modules' tensors, types and dicts: the runtime never replaces
    them after loading, and Inductor's code checks its inputs' sizes itself."""
    return [not entry.orig_guard.source.is_unspecialized_nn_module()
            or entry.guard_type in ("CONSTANT_MATCH", "EQUALS_MATCH", "ID_MATCH")
            for entry in entries]


def compile_options() -> dict:
    """mode="reduce-overhead" as its options (torch.compile takes a mode or options, not
    both), plus emulate_precision_casts: every bf16 intermediate rounds as in eager (else
    fused kernels keep fp32 intermediates and the KV cache drifts from the eager path's
    bits), set for this compile only (set process-wide it also changed the bits of the host
    path's FlexAttention compiled after it), and the guard filter :func:`guards_kept`."""
    return {**torch._inductor.list_mode_options("reduce-overhead"),
            "emulate_precision_casts": True, "guard_filter_fn": guards_kept}


def _compiled(step: DraftStep) -> Callable:
    compiled = torch.compile(step, options=compile_options(), fullgraph=True, dynamic=False)

    def call(*inputs: Tensor) -> tuple[Tensor, ...]:
        # The step writes the KV cache in place, and reduce-overhead graphs a function
        # that mutates its inputs only when they are static (otherwise it skips the CUDA
        # graph: "mutated inputs"). The runtime passes the same buffers every round.
        for tensor in inputs:
            torch._dynamo.mark_static_address(tensor)
        return compiled(*inputs)
    return call


def compile(step: DraftStep, examples: dict[int, tuple[Tensor, ...]], out_dir: Path) -> None:
    compiled = _compiled(step)
    with torch.no_grad():
        for bucket, i, n in progress.buckets(examples):
            progress.phase(f"tracing, lowering and compiling bucket {bucket} ({i}/{n})")
            compiled(*examples[bucket])
    progress.phase("saving Inductor's cache artifacts")
    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        raise RuntimeError("Inductor produced no cache artifacts to save")
    (out_dir / PAYLOAD).write_bytes(saved[0])


def load(out_dir: Path, step: DraftStep, buckets: list[int]) -> dict[int, Callable]:
    torch.compiler.load_cache_artifacts((out_dir / PAYLOAD).read_bytes())
    compiled = _compiled(step)  # recompiles per bucket shape, each from the cache
    return {bucket: compiled for bucket in buckets}
