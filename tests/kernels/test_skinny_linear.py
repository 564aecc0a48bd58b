"""The skinny GEMM (``dspark_compile/kernels/linear/``) against a float64 recomputation, in
Triton's interpreter on the CPU and on CUDA; where the lanes' projections take it."""

import json

import pytest
import torch

from dspark_compile import kernels
from dspark_compile.config import lane_config

NO_TRITON = "Triton is not installed (the CPU wheels of torch come without it)"

# (rows, features, K, bias, splits of K on 132 multiprocessors): 1 and 16 rows, a partial
# last tile of features, K not a multiple of the tile, with and without a bias; narrow
# outputs (8 and 2 programs) whose K splits into 8 and 3 runs of whole 128-column tiles
CASES = [(1, 4096, 384, True, 1), (9, 4096 + 3 * 64 + 5, 256, False, 1),
         (16, 4160, 200, True, 1), (9, 512, 1024, True, 8), (3, 100, 384, False, 3)]

INTERPRETED = """
import json, sys, torch
from dspark_compile.kernels import linear
linear.multiprocessors = lambda device: 132  # the H200's launches (the interpreter has 1)
cases = json.loads(sys.argv[1])
gen = torch.Generator().manual_seed(0)
report = []
for dtype in (torch.float32, torch.float16):  # the interpreter cannot load bf16
    for rows, features, K, bias, _ in cases:
        x = torch.randn(rows, K, generator=gen)
        w = torch.randn(features, K, generator=gen) * K ** -0.5
        b = torch.randn(features, generator=gen) if bias else None
        x, w, b = (None if t is None else t.to(dtype) for t in (x, w, b))
        out = linear.linear(x, w, b)
        exact = x.double() @ w.double().T + (0 if b is None else b.double())
        launch = linear.launch_shape(rows, features, K, 132)
        report.append(dict(dtype=str(dtype), case=[rows, features, K, bias],
                           splits=launch and launch.splits,
                           out_dtype=str(out.dtype), shape=list(out.shape),
                           error=((out.double() - exact).abs() / (exact.abs() + 1)).max().item()))
print(json.dumps(report))
"""


@pytest.mark.skipif(not kernels.HAS_TRITON, reason=NO_TRITON)
def test_the_kernel_matches_a_float64_recomputation_in_the_triton_interpreter(
        interpreted_report):
    report = interpreted_report(INTERPRETED, json.dumps(CASES))
    assert len(report) == 2 * len(CASES)
    for case, (rows, features, _, _, splits) in zip(report, CASES * 2):
        assert case["splits"] == splits, case
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
              (9, 32000, 2048), (9, 2048, 4096), (9, 2048, 6144),
              *((rows, features, K) for rows, features, K, *_ in CASES)]
    for rows, features, K in shapes:
        x = torch.randn(rows, K, generator=gen).bfloat16()
        w = (torch.randn(features, K, generator=gen) * K ** -0.5).bfloat16()
        out = linear.linear(x.to(device), w.to(device)).cpu()
        assert out.dtype == torch.bfloat16 and out.shape == (rows, features)
        # sums of K products in fp32, one bf16 rounding (2^-9 relative) of the output
        torch.testing.assert_close(out.double(), x.double() @ w.double().T, rtol=8e-3,
                                   atol=1e-3)


# hidden and intermediate sizes, and a vocabulary, of 64 or more 64-feature tiles
WIDE = dict(hidden_size=4096, num_heads=32, num_kv_heads=32, head_dim=128,
            intermediate_size=4096, target_vocab_size=4096, draft_vocab_size=4096,
            mask_token_id=4095)
# o and down 1024 features wide (16 programs): their K (4096) splits 8 ways on the H200
NARROW = dict(WIDE, hidden_size=1024)


@pytest.mark.parametrize("sizes, per_layer", [(WIDE, (4, 0)), (NARROW, (2, 2))],
                         ids=["wide", "narrow"])
def test_the_layers_projections_take_the_kernel_at_batch_1_only(device, exported_targets,
                                                               sizes, per_layer):
    """The exported draft step of one request calls ``dspark.linear`` for each layer's
    Q|K|V, o, gate|up and down and for the lm_head where they are wide, and
    ``dspark.linear_partials`` for o and down where the hidden size is narrow (the
    prompt's 40 rows go through cuBLAS); of four requests (20 block rows), none does."""
    if device.type != "cuda":
        pytest.skip("the skinny GEMM runs on CUDA (CPU lanes keep F.linear)")
    if torch.cuda.get_device_properties(device).multi_processor_count < 128:
        pytest.skip("the narrow lane's split counts are the H200's (132 multiprocessors)")
    lane = lane_config("tiny", skinny_gemm=True, **sizes)
    one, four = (exported_targets(lane, device, requests=r) for r in (1, 4))
    ops = (torch.ops.dspark.linear.default, torch.ops.dspark.linear_partials.default)
    assert [one.count(op) for op in ops] == [per_layer[0] * lane.num_layers + 1,
                                             per_layer[1] * lane.num_layers]
    assert [four.count(op) for op in ops] == [0, 0]


@pytest.mark.skipif(not kernels.HAS_TRITON, reason=NO_TRITON)
@pytest.mark.parametrize("features, splits", [(6144, 1), (34816, 1), (2048, 4)])
def test_the_kernel_compiles_for_the_h200_without_register_spills(features, splits,
                                                                  ptxas_for_h200):
    """sm_90, 16 rows, K = 5120 * splits, the three kinds of launch the op picks on 132
    multiprocessors: fewer programs than multiprocessors, more, and K split."""
    from dspark_compile.kernels import linear
    from dspark_compile.kernels.linear.kernels import _linear_kernel

    K = 5120 * splits
    launch = linear.launch_shape(16, features, K, 132)
    assert launch.splits == splits
    constants = dict(K=K, K_SPLIT=K // splits, BLOCK_M=16, BLOCK_N=launch.features,
                     BLOCK_K=launch.block_k, HAS_BIAS=False, PRECISION="tf32")
    aligned = [name for name in _linear_kernel.arg_names
               if name.endswith(("_ptr", "_stride"))]
    pointers = {"x_ptr": "*bf16", "w_ptr": "*bf16", "bias_ptr": "*bf16",
                "out_ptr": "*fp32" if splits > 1 else "*bf16"}
    report = ptxas_for_h200(_linear_kernel, pointers, aligned, constants, launch.warps,
                            launch.stages)
    assert report.returncode == 0, report.stderr
    assert " 0 bytes spill stores" in report.stderr, report.stderr
