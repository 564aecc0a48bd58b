"""The skinny GEMM (``dspark_compile/kernels/linear/``) against a float64 recomputation, in
Triton's interpreter on the CPU and on CUDA; where the lanes' projections take it."""

import json

import pytest
import torch

from dspark_compile import kernels
from dspark_compile.config import lane_config

NO_TRITON = "Triton is not installed (the CPU wheels of torch come without it)"

# (rows, features, K, bias): 1 and 16 rows, a partial last tile of features, K not a
# multiple of the tile, with and without a bias
CASES = [(1, 4096, 384, True), (9, 4096 + 3 * 64 + 5, 256, False), (16, 4160, 200, True)]

INTERPRETED = """
import json, sys, torch
from dspark_compile.kernels import linear
cases = json.loads(sys.argv[1])
gen = torch.Generator().manual_seed(0)
report = []
for dtype in (torch.float32, torch.float16):  # the interpreter cannot load bf16
    for rows, features, K, bias in cases:
        x = torch.randn(rows, K, generator=gen)
        w = torch.randn(features, K, generator=gen) * K ** -0.5
        b = torch.randn(features, generator=gen) if bias else None
        x, w, b = (None if t is None else t.to(dtype) for t in (x, w, b))
        out = linear.linear(x, w, b)
        exact = x.double() @ w.double().T + (0 if b is None else b.double())
        report.append(dict(dtype=str(dtype), case=[rows, features, K, bias],
                           out_dtype=str(out.dtype), shape=list(out.shape),
                           error=((out.double() - exact).abs() / (exact.abs() + 1)).max().item()))
print(json.dumps(report))
"""


@pytest.mark.skipif(not kernels.HAS_TRITON, reason=NO_TRITON)
def test_the_kernel_matches_a_float64_recomputation_in_the_triton_interpreter(
        interpreted_report):
    report = interpreted_report(INTERPRETED, json.dumps(CASES))
    assert len(report) == 2 * len(CASES)
    for case in report:
        rows, features = case["case"][:2]
        assert case["shape"] == [rows, features] and case["out_dtype"] == case["dtype"], case
        # fp32: exact products, fp32 sums; fp16: one rounding of the output (2^-11) more
        assert case["error"] < (1e-5 if case["dtype"] == "torch.float32" else 1e-3), case


def test_the_kernel_matches_a_float64_recomputation_on_cuda(device):
    """bf16 at both real lanes' batch-1 shapes of the layers' projections."""
    if device.type != "cuda":
        pytest.skip("bf16 needs the GPU (the interpreter test above runs fp32 and fp16 here)")
    from dspark_compile.kernels import linear

    gen = torch.Generator().manual_seed(1)
    shapes = [(15, 6144, 5120), (15, 34816, 5120), (15, 5120, 17408), (9, 5120, 2048),
              (9, 32000, 2048), *((rows, features, K) for rows, features, K, _ in CASES)]
    for rows, features, K in shapes:
        x = torch.randn(rows, K, generator=gen).bfloat16()
        w = (torch.randn(features, K, generator=gen) * K ** -0.5).bfloat16()
        out = linear.linear(x.to(device), w.to(device)).cpu()
        assert out.dtype == torch.bfloat16 and out.shape == (rows, features)
        # sums of K products in fp32, one bf16 rounding (2^-9 relative) of the output
        torch.testing.assert_close(out.double(), x.double() @ w.double().T, rtol=8e-3,
                                   atol=1e-3)


def test_the_layers_projections_take_the_kernel_at_batch_1_only(device, exported_targets):
    """A lane whose projections are wide enough: the exported draft step of one request
    calls ``dspark.linear`` for Q|K|V, o, gate|up and down of each layer and for the
    lm_head (the prompt's 40 rows go through cuBLAS); of four requests (20 block rows),
    none does."""
    if device.type != "cuda":
        pytest.skip("the skinny GEMM runs on CUDA (CPU lanes keep F.linear)")
    lane = lane_config("tiny", skinny_gemm=True, **WIDE)
    one = exported_targets(lane, device, requests=1).count(torch.ops.dspark.linear.default)
    four = exported_targets(lane, device, requests=4).count(torch.ops.dspark.linear.default)
    assert (one, four) == (4 * lane.num_layers + 1, 0)


# hidden and intermediate sizes, and a vocabulary, of 64 or more 64-feature tiles
WIDE = dict(hidden_size=4096, num_heads=32, num_kv_heads=32, head_dim=128,
            intermediate_size=4096, target_vocab_size=4096, draft_vocab_size=4096,
            mask_token_id=4095)


POINTERS = {"x_ptr": "*bf16", "w_ptr": "*bf16", "bias_ptr": "*bf16", "out_ptr": "*bf16"}


@pytest.mark.skipif(not kernels.HAS_TRITON, reason=NO_TRITON)
@pytest.mark.parametrize("features", [6144, 34816])  # one launch each: fewer, more programs
def test_the_kernel_compiles_for_the_h200_without_register_spills(features, ptxas_for_h200):
    """sm_90, 16 rows, both launches the op picks on 132 multiprocessors."""
    from dspark_compile.kernels import linear
    from dspark_compile.kernels.linear.kernels import _linear_kernel

    launch = linear.launch_shape(16, features, 132)
    constants = dict(K=5120, BLOCK_M=16, BLOCK_N=launch.features, BLOCK_K=launch.block_k,
                     HAS_BIAS=False, PRECISION="tf32")
    aligned = [name for name in _linear_kernel.arg_names
               if name.endswith(("_ptr", "_stride"))]
    report = ptxas_for_h200(_linear_kernel, POINTERS, aligned, constants, launch.warps,
                            launch.stages)
    assert report.returncode == 0, report.stderr
    assert " 0 bytes spill stores" in report.stderr, report.stderr
