"""The noise kernel (``dspark_compile/kernels/noise/``) against the tensor ops of
``dspark_compile.rng``, bit for bit, in Triton's interpreter on the CPU and on CUDA."""

import inspect
import json

import pytest

from dspark_compile import kernels

NO_TRITON = "Triton is not installed (the CPU wheels of torch come without it)"

# (rows, step, size): one value; the verifier's k + 1 on its stream; a whole block, and
# sizes past one block, one on the target's first-token stream
CASES = [(1, 0, 1), (3, 1 << 20, 6), (4, 1, 128), (5, 7, 300), (2, (1 << 20) + 2, 129)]


def compare(cases: list, device: str) -> list[dict]:
    """Each case's kernel noise against the tensor ops' on ``device``, and its first row
    against the hash recomputed in Python's integers."""
    import torch

    from dspark_compile import rng
    from dspark_compile.kernels import noise

    def mix(x: int) -> int:  # the avalanche in Python's integers, wrapped at 32 bits
        x ^= x >> 16
        x = x * 0x7FEB352D % 2**32
        x ^= x >> 15
        x = x * 0x5BD1E995 % 2**32
        return x ^ (x >> 16)

    def brute(seed: int, position: int, step: int, size: int) -> list[float]:
        key = mix(mix(mix(seed % 2**32) ^ position % 2**32) ^ step)
        return [(mix(key ^ i) + 0.5) / 2**32 for i in range(size)]

    g = torch.Generator().manual_seed(0)
    report = []
    for rows, step, size in cases:
        seed = torch.randint(-(1 << 62), 1 << 62, (rows,), generator=g)
        position = torch.randint(0, 1 << 40, (rows,), generator=g)
        seed[0], position[0] = (1 << 63) - 1, (1 << 32) - 1  # the largest key, the mask's edge
        seed, position = seed.to(device), position.to(device)
        ours = noise.uniform(seed, position, step, size)
        first = brute(int(seed[0]), int(position[0]), step, size)  # a brute force of row 0
        report.append(dict(equal=torch.equal(ours, rng.uniform(seed, position, step, size))
                           and ours[0].tolist() == first, shape=list(ours.shape)))
    return report


def check(report: list[dict]) -> None:
    assert [case["shape"] for case in report] == [[rows, size] for rows, _, size in CASES]
    assert all(case["equal"] for case in report), report


@pytest.mark.skipif(not kernels.HAS_TRITON, reason=NO_TRITON)
def test_the_kernel_is_the_tensor_ops_hash_in_the_triton_interpreter(interpreted_report):
    script = inspect.getsource(compare) + (
        "\nimport json, sys\nprint(json.dumps(compare(json.loads(sys.argv[1]), 'cpu')))")
    check(interpreted_report(script, json.dumps(CASES)))


def test_the_kernel_is_the_tensor_ops_hash_on_cuda(device):
    if device.type != "cuda":
        pytest.skip("the kernel runs on CUDA (the interpreter test above runs it here)")
    check(compare(CASES, "cuda"))


@pytest.mark.skipif(not kernels.HAS_TRITON, reason=NO_TRITON)
def test_one_compile_serves_every_size(monkeypatch, h200_specializations):
    """Triton compiles a kernel again for each new specialization of its integer arguments
    (one equal to 1, one divisible by 16): the launches for sizes 1 .. 17 (the verifier's
    k + 1 of any drafter up to 16) specialize alike for the H200."""
    import torch

    from dspark_compile.kernels import noise
    from dspark_compile.kernels.noise import kernels as module

    monkeypatch.setattr(noise, "runs_on", lambda device: True)
    seed = position = torch.arange(3)
    launches = h200_specializations(module, "uniform_kernel", lambda: [
        noise.uniform(seed, position, 1 << 20, size) for size in range(1, 18)])
    assert len(launches) == 17 and len({key for _, key in launches}) == 1, launches
