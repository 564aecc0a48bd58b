"""The fused Markov step (``dspark_compile/fused_markov.py``) against the loop it replaces."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dspark_compile import fused_markov
from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import lane_config
from dspark_compile.draft import DraftStep, KVCache
from dspark_compile.errors import ConfigError
from dspark_compile.rounds import synthetic_rounds

NO_TRITON = "Triton is not installed (the CPU wheels of torch come without it)"
ON_CUDA_ONLY = "the kernel runs on CUDA; elsewhere a fused lane keeps the loop"


@pytest.mark.parametrize("changes", [dict(markov_head="gated"), dict(markov_head="rnn"),
                                     dict(dtype="float32"), dict(markov_rank=48),
                                     dict(markov_rank=8)])
def test_the_fused_step_is_refused_where_the_kernel_does_not_apply(changes):
    with pytest.raises(ConfigError, match="fused_markov_step"):
        lane_config("tiny", fused_markov_step=True, **changes)


# The kernel, run by Triton's interpreter on the CPU, step by step against markov_loop on the
# same inputs: W2's rows and the base logits repeat inside the first tile, and their second
# half repeats the first, so rows meet exact ties inside and across tiles, which the lowest
# index must win. Odd rows sample at
# T = 0.8. The interpreter cannot load bf16 from CPU memory, so the kernel gets fp32 copies
# of the bf16 values (the same numbers).
INTERPRETED = """
import json, torch
from dspark_compile import fused_markov
from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import lane_config
from dspark_compile.draft import markov_loop
from dspark_compile.model.vocab import to_target

lane = lane_config("tiny_d2t", draft_vocab_size=320)  # 2.5 tiles: the last one masked
drafter = random_drafter(lane, "cpu", seed=3)
head = drafter.markov_head
V = lane.draft_vocab_size
half = V // 2
assert half >= fused_markov.BLOCK_V  # the repeats lie in other tiles
g = torch.Generator().manual_seed(0)
with torch.no_grad():
    head.markov_w2.weight[64:96] = head.markov_w2.weight[0:32]  # ties inside a tile
    head.markov_w2.weight[half:2 * half] = head.markov_w2.weight[:half]  # and across
differ = ties = tokens = 0
for R in (1, 6, 20):  # padded to 16 and 32 rows inside the kernel
    with torch.no_grad():
        base = (torch.randint(-6, 6, (R, lane.k, V), generator=g) / 4).bfloat16()
        base[..., 64:96] = base[..., 0:32]
        base[..., half:2 * half] = base[..., :half]
        anchor = torch.randint(0, lane.target_vocab_size, (R,), generator=g)
        temperature = torch.tensor([0.0, 0.8] * R)[:R]
        seed = torch.arange(R) * 7
        anchor_pos = torch.arange(R) + 40
        h = torch.zeros(R, lane.k, lane.hidden_size, dtype=torch.bfloat16)
        ids, prevs, z = markov_loop(drafter, h, base, anchor, temperature, seed, anchor_pos)
        wide = base.float()  # strided per step, as in the draft step
        for step in range(lane.k):
            got = fused_markov.markov_step(
                head.markov_w1.weight.float(), head.markov_w2.weight.float(), wide[:, step],
                prevs[:, step], temperature, seed, anchor_pos, step)
            differ += int((to_target(got, drafter.d2t) != ids[:, step]).sum())
            top = z[:, step].float()
            ties += int(((top == top.max(-1, keepdim=True).values).sum(-1) > 1)[0::2].sum())
        tokens += ids.numel()
print(json.dumps(dict(differ=differ, ties=ties, tokens=tokens)))
"""


@pytest.mark.skipif(fused_markov.triton is None, reason=NO_TRITON)
def test_the_kernel_matches_the_loop_step_in_the_triton_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run([sys.executable, "-c", INTERPRETED], env=env, capture_output=True,
                            text=True, timeout=600)
    if "wrap_triton only works on functions annotated" in result.stderr:
        pytest.skip("this torch's wrap_triton refuses Triton's interpreted kernels "
                    "(torch 2.13 runs them); the CUDA tests below check the kernel here")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["ties"] > 0, report  # the greedy rows met exact ties to break
    assert report["differ"] == 0, report


# the kernel's arguments as the op passes them for a bf16 lane
SIGNATURE = {"w1_ptr": "*bf16", "w2_ptr": "*bf16", "base_ptr": "*bf16", "prev_ptr": "*i64",
             "temperature_ptr": "*fp32", "seed_ptr": "*i64", "position_ptr": "*i64",
             "best_ptr": "*fp64", "index_ptr": "*i64", "R": "i32", "V": "i32",
             "base_stride": "i32", "step": "i32", "RANK": "constexpr", "R_PAD": "constexpr",
             "BLOCK": "constexpr", "BLOCK_K": "constexpr"}


@pytest.mark.skipif(fused_markov.triton is None, reason=NO_TRITON)
@pytest.mark.parametrize("rows", [1, 20, 64])
def test_the_kernel_compiles_for_the_h200_without_register_spills(rows, tmp_path):
    """Triton compiles ahead of time with the ptxas it ships, no GPU needed: sm_90 (the
    H200), the real lanes' rank 256, the launch shape the op uses for ``rows`` requests."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    padded, block, warps = fused_markov.launch_shape(rows)
    source = ASTSource(fn=fused_markov._markov_step_kernel, signature=SIGNATURE,
                       constexprs=dict(RANK=256, R_PAD=padded, BLOCK=block, BLOCK_K=64))
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=warps))
    ptx = tmp_path / "kernel.ptx"
    ptx.write_text(kernel.asm["ptx"])
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    report = subprocess.run([str(ptxas), "--gpu-name", "sm_90a", "-v", str(ptx), "-o",
                             str(tmp_path / "kernel.cubin")], capture_output=True, text=True)
    assert report.returncode == 0, report.stderr
    assert " 0 bytes spill stores" in report.stderr, report.stderr


@pytest.mark.parametrize("lane_name", ["tiny", "tiny_d2t"])
@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_fused_lane_matches_the_host_path(both_paths, device, lane_name, batch, temperature):
    if device.type != "cuda":
        pytest.skip(ON_CUDA_ONLY)
    drafter = random_drafter(lane_config(lane_name, fused_markov_step=True), device, seed=batch)
    for (ids, confidences), ref in both_paths(drafter, batch, 300, 4, seed=5,
                                              temperature=temperature):
        assert torch.equal(ids.cpu(), ref.ids)
        assert torch.equal(confidences.cpu(), ref.confidences)


@pytest.mark.parametrize("backend", ["inductor", "aoti"])
def test_compiled_artifacts_of_a_fused_lane_are_token_identical(built_artifact, fresh_verify,
                                                                device, backend):
    """Inductor (fullgraph) and AOTInductor keep the kernel in their one graph: a graph
    break fails the build, a dropped or rewritten step fails dspark-verify."""
    if device.type != "cuda":
        pytest.skip(ON_CUDA_ONLY)
    artifact = built_artifact(backend, "tiny_d2t", fused_markov_step=True)
    code, report, stderr = fresh_verify(artifact, "temperature=1.0", "rounds=12")
    assert code == 0, stderr
    assert report["identical"] and report["tokens_compared"] > 0


def test_the_exported_program_calls_the_kernel(device):
    if device.type != "cuda":
        pytest.skip(ON_CUDA_ONLY)
    lane = lane_config("tiny_d2t", fused_markov_step=True)
    step = DraftStep(random_drafter(lane, device, seed=0))
    inputs = next(iter(synthetic_rounds(lane, 3, 40, 1, 0, device, 1.0))).tensors()
    cache = KVCache.allocate(lane, 3, device, 64)
    with torch.no_grad():
        program = torch.export.export(step, (cache.k, cache.v, *inputs), strict=False)
    calls = [n for n in program.graph.nodes if n.target is torch.ops.dspark.markov_step.default]
    assert len(calls) == lane.k
