"""The block's attention kernel (``dspark_compile/kernels/attention/``) against a float64
recomputation written here from the masking rules, in Triton's interpreter on the CPU and
on CUDA."""

from pathlib import Path

import pytest
import torch

from dspark_compile import kernels
from dspark_compile.config import lane_config

NO_TRITON = "Triton is not installed (the CPU wheels of torch come without it)"
HERE = Path(__file__).parent

def recomputed(q, k, v, anchor_pos, window, causal, scale):
    """float64, one query row at a time: row i of a block at s sees slots < s + n, from
    s - window on where window > 0, and inside the block (slots >= s) only up to s + i
    where causal."""
    R, n, heads, _ = q.shape
    group = heads // k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    slots = torch.arange(k.shape[2])
    for r in range(R):
        s = int(anchor_pos[r])
        for i in range(n):
            seen = slots < s + n
            if window > 0:
                seen &= slots >= s - window
            if causal:
                seen &= (slots < s) | (slots <= s + i)
            for head in range(heads):
                keys = k[r, head // group, seen].double()
                values = v[r, head // group, seen].double()
                weights = (keys @ q[r, i, head].double() * scale).softmax(0)
                out[r, i, head] = weights @ values
    return out


# (R, rows n, heads, kv heads, head_dim, slots, window, causal, anchor positions)
CASES = [(3, 5, 4, 2, 16, 100, 0, False, [0, 31, 94]),
         (3, 5, 4, 2, 16, 100, 20, True, [2, 33, 64]),
         (2, 6, 6, 2, 32, 77, 7, False, [13, 70]),
         (2, 9, 8, 1, 16, 200, 100, True, [150, 191])]

INTERPRETED = """
import dataclasses, json, sys, torch
sys.path.insert(0, sys.argv[1])
from test_block_attention import CASES, recomputed
from dspark_compile.kernels import attention
default = attention.launch_shape
launches = {"default": default,
            "chunks of 32, tiles of 16": lambda rows, head_dim: dataclasses.replace(
                default(rows, head_dim), chunk=32, block_n=16)}
gen = torch.Generator().manual_seed(0)
report = []
for name, launch in launches.items():
    attention.launch_shape = launch
    for R, n, heads, kv_heads, head_dim, slots, window, causal, positions in CASES:
        q = torch.randn(R, n, heads, head_dim, generator=gen)
        k, v = (torch.randn(R, kv_heads, slots, head_dim, generator=gen) for _ in "kv")
        anchor_pos = torch.tensor(positions)
        # what no row may see is NaN: a key read past the rules poisons the output
        for r, s in enumerate(positions):
            lo = max(s - window, 0) if window else 0
            for cache in (k, v):
                cache[r, :, :lo] = float("nan")
                cache[r, :, s + n:] = float("nan")
        scale = head_dim ** -0.5
        out = attention.block_attention(q, k, v, anchor_pos, window, causal, scale)
        error = (out.double() - recomputed(q, k, v, anchor_pos, window, causal, scale)).abs()
        # the last request alone, in a cache cut after its block: the same bits
        r, cut = R - 1, positions[-1] + n
        alone = attention.block_attention(q[r:], k[r:, :, :cut], v[r:, :, :cut],
                                          anchor_pos[r:], window, causal, scale)
        report.append(dict(launch=name, error=error.max().item(),
                           alone_equal=torch.equal(alone, out[r:])))
print(json.dumps(report))
"""


@pytest.mark.skipif(not kernels.HAS_TRITON, reason=NO_TRITON)
def test_the_kernel_matches_a_float64_recomputation_in_the_triton_interpreter(
        interpreted_report):
    """fp32 (the interpreter cannot load bf16 from CPU memory): full and sliding layers,
    causal and bidirectional blocks, GQA groups whose rows are no power of two, anchors at
    0, unaligned and near the end; the op's own launch and one with several chunks and
    partial tiles. A request's result is the same bits alone and in a batch, in a cache of
    any capacity."""
    report = interpreted_report(INTERPRETED, str(HERE))
    assert len(report) == 2 * len(CASES)
    for case in report:
        assert case["error"] < 1e-5, case
        assert case["alone_equal"], case


def test_the_kernel_matches_a_float64_recomputation_on_cuda(device):
    """bf16, the op's own launch; the last case spans several chunks of it."""
    if device.type != "cuda":
        pytest.skip("bf16 needs the GPU (the interpreter test above runs fp32 here)")
    from dspark_compile.kernels import attention

    gen = torch.Generator().manual_seed(1)
    long = (2, 15, 8, 2, 128, 1400, 0, False, [700, 1300])
    assert attention.launch_shape(4 * 15, 128).chunk < 1300  # several chunks
    for R, n, heads, kv_heads, head_dim, slots, window, causal, positions in CASES + [long]:
        q = torch.randn(R, n, heads, head_dim, generator=gen)
        k, v = (torch.randn(R, kv_heads, slots, head_dim, generator=gen) for _ in "kv")
        anchor_pos = torch.tensor(positions)
        scale = head_dim ** -0.5
        out = attention.block_attention(*(t.bfloat16().to(device) for t in (q, k, v)),
                                        anchor_pos.to(device), window, causal, scale)
        expected = recomputed(*(t.bfloat16() for t in (q, k, v)), anchor_pos, window, causal,
                              scale)
        torch.testing.assert_close(out.cpu().double(), expected, rtol=2e-2, atol=2e-2)


POINTERS = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "anchor_pos_ptr": "*i64",
            "acc_ptr": "*fp32", "best_ptr": "*fp32", "total_ptr": "*fp32", "out_ptr": "*bf16"}


@pytest.mark.skipif(not kernels.HAS_TRITON, reason=NO_TRITON)
@pytest.mark.parametrize("lane_name", ["qwen36_27b", "qwen36_35b_a3b"])
def test_the_kernels_compile_for_the_h200_without_register_spills(lane_name, ptxas_for_h200):
    """Triton compiles ahead of time with the ptxas it ships, no GPU needed: sm_90, a real
    lane's shapes and the launch the op uses for them, with the specialization Triton's
    launcher gives (pointers and the strides of the cache known to be multiples of 16)."""
    from dspark_compile.kernels import attention
    from dspark_compile.kernels.attention import kernels as attention_kernels

    lane = lane_config(lane_name)
    group = lane.num_heads // lane.num_kv_heads
    launch = attention.launch_shape(group * lane.block_rows, lane.head_dim)
    row_blocks = -(-group * lane.block_rows // launch.block_m)
    slots = lane.max_context + lane.block_rows + 1
    constants = dict(KV_HEADS=lane.num_kv_heads, GROUP=group, ROWS=lane.block_rows,
                     HEAD_DIM=lane.head_dim, WINDOW=lane.sliding_window or 0,
                     CAUSAL=lane.has_sliding_layers and lane.sliding_causal,
                     SCALE=lane.head_dim ** -0.5,
                     CHUNK=launch.chunk, CHUNKS=-(-slots // launch.chunk),
                     BLOCK_M=launch.block_m, BLOCK_N=launch.block_n,
                     ROWS_PAD=row_blocks * launch.block_m, PRECISION="tf32")
    merge = dict(constants, BLOCK_M=min(attention.MERGE_ROWS, launch.block_m))
    for kernel, stages, constexprs in (
            (attention_kernels._attend_chunk_kernel, launch.stages, constants),
            (attention_kernels._merge_chunks_kernel, 1, merge)):
        aligned = [name for name in kernel.arg_names if name.endswith("_ptr")
                   or (name.endswith(("_r", "_h", "_s")) and name[0] in "kv")]
        report = ptxas_for_h200(kernel, POINTERS, aligned, constexprs, launch.warps, stages)
        assert report.returncode == 0, report.stderr
        assert " 0 bytes spill stores" in report.stderr, (kernel.__name__, report.stderr)
