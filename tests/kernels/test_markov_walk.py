"""The fused Markov step (``dspark_compile/kernels/markov/``) against the loop it replaces."""

import pytest
import torch

from dspark_compile import kernels
from dspark_compile.kernels import markov
from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import lane_config
from dspark_compile.draft.sampling import rounded
from dspark_compile.errors import ConfigError

NO_TRITON = "Triton is not installed (the CPU wheels of torch come without it)"
ON_CUDA_ONLY = "the kernel runs on CUDA; elsewhere a fused lane keeps the loop"


@pytest.mark.parametrize("changes", [dict(markov_head="gated"), dict(markov_head="rnn"),
                                     dict(dtype="float32"), dict(markov_rank=48),
                                     dict(markov_rank=8)])
def test_the_fused_step_is_refused_where_the_kernel_does_not_apply(changes):
    with pytest.raises(ConfigError, match="fused_markov_step"):
        lane_config("tiny", fused_markov_step=True, **changes)


# The walk, run by Triton's interpreter on the CPU, against markov_loop on the same inputs:
# W2's rows and the base logits repeat inside the first tile, and their second half repeats
# the first, so rows meet exact ties inside tiles, across tiles and across programs, which
# the lowest index must win. Odd rows sample at T = 0.8. Three launches: the op's own (all
# k steps in one resident launch up to 16 rows, a launch per step past them, which walks
# its programs' runs backwards at odd steps: ties met in both orders), one tile per
# program, and runs of three tiles (the last program's run cut short). The interpreter
# cannot load bf16 from CPU memory, so the kernel gets fp32 copies of the bf16 values (the
# same numbers). Triton 3.6's interpreter truncates fp32 -> bf16 (the GPU's cvt.rn rounds
# to nearest even: test_the_kernel_rounds_to_bf16_as_the_eager_path_does), so the script
# converts as the GPU does (GPU_ROUNDING, which test_certified_walk shares).
GPU_ROUNDING = """
import json, numpy as np, torch
import triton.language as tl
from triton.runtime import interpreter
from dspark_compile.kernels import markov
from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import lane_config
from dspark_compile.draft.markov import markov_loop

cast = interpreter.InterpreterBuilder.cast_impl
def cast_as_the_gpu(self, src, dst_type):
    data = np.ascontiguousarray(src.data)
    if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
        bits = torch.from_numpy(data).to(torch.bfloat16).view(torch.int16).numpy()
        return interpreter.TensorHandle(bits.view(np.uint16), tl.bfloat16)
    if src.dtype.scalar == tl.bfloat16 and dst_type.scalar == tl.float32:
        wide = data.astype(np.uint32) << 16
        return interpreter.TensorHandle(wide.view(np.float32), tl.float32)
    return cast(self, src, dst_type)
interpreter.InterpreterBuilder.cast_impl = cast_as_the_gpu
"""
INTERPRETED = GPU_ROUNDING + """
lane = lane_config("tiny_d2t", draft_vocab_size=320)  # 2.5 or 5 tiles: the last one masked
drafter = random_drafter(lane, "cpu", seed=3)
head = drafter.markov_head
V = lane.draft_vocab_size
half = V // 2
g = torch.Generator().manual_seed(0)
with torch.no_grad():
    head.markov_w2.weight[64:96] = head.markov_w2.weight[0:32]  # ties inside a tile
    head.markov_w2.weight[half:2 * half] = head.markov_w2.weight[:half]  # and across
default = markov.launch.launch_shape
launches = {"default": default,
            "a tile each": lambda *shape: markov.launch.Launch(default(*shape).rows, 128, 4, 4),
            "runs of 3 tiles": lambda *shape: markov.launch.Launch(default(*shape).rows, 64, 4, 2)}
report = {name: dict(differ=0, ties=0, tokens=0, grids=[], resident=[]) for name in launches}
for R in (1, 20):  # padded to 16 (resident walk) and 32 rows (a launch per step)
    with torch.no_grad():
        base = (torch.randint(-6, 6, (R, lane.k, V), generator=g) / 4).bfloat16()
        base[..., 64:96] = base[..., 0:32]
        base[..., half:2 * half] = base[..., :half]
        anchor = torch.randint(0, lane.target_vocab_size, (R,), generator=g)
        temperature = torch.tensor([0.0, 0.8] * R)[:R]
        seed = torch.arange(R) * 7
        anchor_pos = torch.arange(R) + 40
        h = torch.zeros(R, lane.k, lane.hidden_size, dtype=torch.bfloat16)
        ids, _, z = markov_loop(drafter, h, base, None, anchor, temperature, seed, anchor_pos)
    top = z.float()
    ties = int(((top == top.max(-1, keepdim=True).values).sum(-1) > 1)[0::2].sum())
    for name, launch in launches.items():
        markov.launch.launch_shape = launch
        got = markov.markov_walk(
            head.markov_w1.weight.float(), head.markov_w2.weight.float(), base.float(),
            anchor, temperature, seed, anchor_pos, drafter.d2t)
        shape = launch(R, V, lane.markov_rank, 1)
        report[name]["grids"].append(markov.launch.grid(shape, -(-V // shape.block), 1))
        report[name]["resident"].append(shape.resident)
        report[name]["differ"] += int((got != ids).sum())
        report[name]["ties"] += ties
        report[name]["tokens"] += ids.numel()
print(json.dumps(report))
"""


@pytest.mark.skipif(not kernels.HAS_TRITON, reason=NO_TRITON)
def test_the_walk_matches_the_loop_in_the_triton_interpreter(interpreted_report):
    report = interpreted_report(INTERPRETED)
    # (programs, tiles per program): the CPU counts as one multiprocessor
    assert report["default"]["resident"] == [True, False], report
    assert report["a tile each"]["grids"] == [[3, 1]] * 2, report
    assert report["runs of 3 tiles"]["grids"] == [[2, 3]] * 2, report
    for counts in report.values():
        assert counts["ties"] > 0, report  # the greedy rows met exact ties to break
        assert counts["differ"] == 0, report


# the kernels' pointer arguments as the op passes them for a bf16 lane; the others are
# 32-bit integers or compile-time constants
POINTERS = {"w1_ptr": "*bf16", "w2_ptr": "*bf16", "base_ptr": "*bf16", "anchor_ptr": "*i64",
            "temperature_ptr": "*fp32", "seed_ptr": "*i64", "position_ptr": "*i64",
            "d2t_ptr": "*i64", "best_ptr": "*fp64", "index_ptr": "*i32", "count_ptr": "*i32",
            "ids_ptr": "*i64", "norms_ptr": "*fp32", "candidates_ptr": "*i64",
            "top_ptr": "*fp32", "size_ptr": "*fp32", "norm_top_ptr": "*fp32",
            "read_ptr": "*i32"}


@pytest.mark.skipif(not kernels.HAS_TRITON, reason=NO_TRITON)
@pytest.mark.parametrize("certified", [False, True])
@pytest.mark.parametrize("rows", [1, 8, 16, 20, 64, 128])
@pytest.mark.parametrize("lane_name", ["qwen36_27b", "qwen36_35b_a3b"])
def test_the_kernel_compiles_for_the_h200_without_register_spills(lane_name, rows, certified,
                                                                  ptxas_for_h200):
    """Triton compiles ahead of time with the ptxas it ships, no GPU needed: sm_90 (the
    H200's 132 multiprocessors), a real lane's rank and vocabulary, the kernel and launch
    the op uses for ``rows`` requests there, and the specialization Triton's launcher gives
    it there: pointers and the vocabulary-sized integers known to be multiples of 16
    (without it Triton neither vectorizes nor pipelines the loads, and the kernel is
    another one). ``certified``: the certified walk's step, where the walk streams."""
    from dspark_compile.kernels.markov import kernels

    lane = lane_config(lane_name)
    launch = markov.launch.launch_shape(rows, lane.draft_vocab_size, lane.markov_rank, 132)
    programs, run = markov.launch.grid(launch, -(-lane.draft_vocab_size // launch.block), 132)
    if certified and (launch.resident or launch.rows > markov.launch.CERTIFIED_ROWS):
        pytest.skip("the certified op runs the full walk here: a resident walk reads W2 "
                    "once, and past CERTIFIED_ROWS rows the certified step would spill")
    kernel = (kernels._markov_walk_kernel if launch.resident
              else kernels._markov_step_kernel)
    aligned = [n for n in kernel.arg_names if n.endswith("_ptr")] + ["V", "base_stride"]
    constants = dict(R=rows, K=lane.k, RANK=lane.markov_rank, R_PAD=launch.rows,
                     BLOCK=launch.block, RUN=run, PROGRAMS=programs,
                     PARTS=markov.launch.reduction_chunk(launch, programs), HAS_D2T=True,
                     C=launch.block // launch.rows, RUN_PAD=1 << (run - 1).bit_length())
    # a streaming launch walks its tiles forwards or backwards (every other step)
    for reverse in (False,) if launch.resident else (False, True):
        report = ptxas_for_h200(kernel, POINTERS, aligned,
                                dict(constants, REVERSE=reverse, CERTIFIED=certified),
                                launch.warps, launch.stages)
        assert report.returncode == 0, report.stderr
        assert " 0 bytes spill stores" in report.stderr, report.stderr


if kernels.HAS_TRITON:
    import triton
    import triton.language as tl

    from dspark_compile.kernels.markov import tiles

    @triton.jit
    def _rounding_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + i, mask=i < N)
        tl.store(y_ptr + i, tiles._round_bf16(x), mask=i < N)


@pytest.mark.skipif(not kernels.HAS_TRITON, reason=NO_TRITON)
def test_the_kernel_rounds_to_bf16_as_the_eager_path_does(device):
    """fp32 values exactly halfway between two bf16 values (after an even and after an odd
    last bit), one bit either side of halfway, subnormals, and values that round past
    bf16's largest finite one, both signs: the kernel's rounding, bit for bit, against
    ``draft.rounded``'s."""
    if device.type != "cuda":
        pytest.skip(ON_CUDA_ONLY)
    high = torch.tensor([0x3F80, 0x3F81, 0x4049, 0x0001, 0x0002, 0x007F, 0x7F7E, 0x7F7F],
                        dtype=torch.int32)  # the upper 16 bits: both parities, subnormal, huge
    low = torch.tensor([0x0000, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=torch.int32)
    bits = (high[:, None] << 16 | low[None, :]).flatten()
    bits = torch.cat([bits, bits | -0x80000000])  # and negated
    x = bits.view(torch.float32).to(device)
    y = torch.empty_like(x)
    _rounding_kernel[(1,)](x, y, x.numel(), BLOCK=128)
    expected = rounded(x, torch.bfloat16)
    assert torch.isinf(expected).any()  # the largest values did round past bf16's range
    assert torch.equal(y.view(torch.int32), expected.view(torch.int32))


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


def test_the_exported_program_calls_the_walk_in_place_of_the_loop(device, exported_targets):
    if device.type != "cuda":
        pytest.skip(ON_CUDA_ONLY)
    targets = exported_targets(lane_config("tiny_d2t", fused_markov_step=True), device)
    assert targets.count(torch.ops.dspark.markov_walk.default) == 1
    assert torch.ops.aten.argmax.default not in targets  # the loop's reduction is gone
