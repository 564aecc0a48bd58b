"""The sampled-verification kernel (``dspark_compile/kernels/verify/``) against the tensor
ops of ``speculative.acceptance`` (whose distribution the loop's tests check), in Triton's
interpreter on the CPU and on CUDA: the same accepted counts and tokens."""

import inspect
import json

import pytest

from dspark_compile import kernels

NO_TRITON = "Triton is not installed (the CPU wheels of torch come without it)"

# (k, vocabulary, temperature, verify lengths 0 .. k, q above p everywhere at a row): the
# target's own step (k = 0); one block and a partial second; a vocabulary of a few tokens
CASES = [(0, 300, 1.0, False, False), (1, 7, 0.7, False, True), (3, 1500, 1.0, True, True),
         (5, 300, 0.7, True, False), (5, 1500, 1.0, False, True), (2, 7, 1.0, True, False)]


def compare(cases: list, device: str, repeats: int) -> list[dict]:
    """Each case, ``repeats`` times with fresh draws: the kernel's verification of 4 of 6
    rows (in shuffled order) against the tensor ops'."""
    import torch

    from dspark_compile.kernels.verify import verify_sampling_fused
    from dspark_compile.speculative import acceptance

    g = torch.Generator().manual_seed(0)
    report = []
    for k, V, temperature, with_lengths, q_over_p in cases:
        equal, accepted_seen = True, set()
        for _ in range(repeats):
            logits = torch.randn(6, k + 1, V, generator=g) * 2
            # q near the target's p, so that drafts pass and fail; the round's probs are
            # [R, k_lane, V], of which the loop verifies the first k (a strided slice)
            q = torch.softmax(logits[:, :k] / temperature
                              + 0.5 * torch.randn(6, k, V, generator=g), -1)
            q = torch.cat([q, torch.rand(6, 1, V, generator=g)], 1)[:, :k]
            drafted = (torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(6, k)
                       if k else torch.zeros(6, 0, dtype=torch.long))
            rows = torch.randperm(6, generator=g)[:4]
            q = q[rows]
            if q_over_p:  # a rejection leaves nothing to correct: the token is drawn from p
                q[0] = 1.5 * torch.softmax(logits[rows[0], :k] / temperature, -1)
            seed = torch.randint(-(1 << 62), 1 << 62, (4,), generator=g)
            position = torch.randint(0, 1 << 40, (4,), generator=g)
            lengths = torch.randint(0, k + 1, (4,), generator=g) if with_lengths else None
            args = [t.to(device) for t in (drafted, q, logits, rows)]
            keys = [t.to(device) for t in (seed, position)]
            lengths = None if lengths is None else lengths.to(device)
            ours = verify_sampling_fused(*args, temperature, *keys, acceptance.ACCEPT_STREAM,
                                         lengths)
            drafted, q, logits, rows = args
            p = acceptance.target_probs(logits, rows, temperature)
            theirs = acceptance.verify_sampling(drafted[rows], q, p, *keys, lengths)
            equal &= all(torch.equal(a, b) for a, b in zip(ours, theirs))
            accepted_seen.update(theirs[0].tolist())
        report.append(dict(equal=equal, accepted=sorted(accepted_seen)))
    return report


def check(report: list[dict]) -> None:
    assert all(case["equal"] for case in report), report
    # the cases reach rejections at the first draft, in the middle, and full acceptance
    seen = set().union(*(case["accepted"] for case in report))
    assert seen == set(range(6)), seen


@pytest.mark.skipif(not kernels.HAS_TRITON, reason=NO_TRITON)
def test_the_kernel_verifies_as_the_tensor_ops_in_the_triton_interpreter(interpreted_report):
    script = inspect.getsource(compare) + (
        "\nimport json, sys\nprint(json.dumps(compare(json.loads(sys.argv[1]), 'cpu', 6)))")
    check(interpreted_report(script, json.dumps(CASES)))


def test_the_kernel_verifies_as_the_tensor_ops_on_cuda(device):
    if device.type != "cuda":
        pytest.skip("the kernel runs on CUDA (the interpreter test above runs it here)")
    check(compare(CASES, "cuda", 50))


@pytest.mark.skipif(not kernels.HAS_TRITON, reason=NO_TRITON)
@pytest.mark.parametrize("k", [7, 15])
def test_the_kernel_compiles_for_the_h200_without_register_spills(k, ptxas_for_h200):
    """Triton compiles it ahead of time for sm_90 with the ptxas it ships, no GPU needed:
    the testbed's vocabulary (SmolLM2's 49152), the launch the loop uses for every verify
    width of a drafter of ``k`` (the testbed's 7, and more)."""
    from dspark_compile.kernels import verify
    from dspark_compile.kernels.verify.kernels import verify_kernel

    pointers = dict(ids_ptr="*i64", q_ptr="*fp32", logits_ptr="*fp32", rows_ptr="*i64",
                    lengths_ptr="*i64", seed_ptr="*i64", position_ptr="*i64",
                    accepted_ptr="*i64", tokens_ptr="*i64", t="fp32")
    aligned = [n for n in verify_kernel.arg_names if n.endswith("_ptr")]
    constants = dict(V=49152, POSITIONS=verify.positions(k), HAS_LENGTHS=True,
                     BLOCK=verify.STATS_BLOCK // verify.positions(k), BLOCK_ROW=verify.BLOCK_ROW)
    report = ptxas_for_h200(verify_kernel, pointers, aligned, constants, verify.WARPS, 1)
    assert report.returncode == 0, report.stderr
    assert " 0 bytes spill stores" in report.stderr, report.stderr


@pytest.mark.skipif(not kernels.HAS_TRITON, reason=NO_TRITON)
@pytest.mark.parametrize("k,compiles", [(7, 1), (15, 2)])
def test_one_compile_serves_every_verify_width(k, compiles, h200_specializations):
    """Triton compiles a kernel again for each new specialization of its integer
    arguments (one equal to 1, one divisible by 16), a pause in the round that meets it
    first. The launches the loop makes for a drafter of ``k``, at every verify width
    0 .. k and for the target's own step, specialize alike for the H200 (with verify
    lengths, and without): one compile up to 7 drafts, and one more for 8 to 15 (twice
    the positions)."""
    import torch

    from dspark_compile.kernels import verify
    from dspark_compile.kernels.verify import kernels as module

    V, R = 49152, 3  # the testbed's vocabulary
    rows, probs = torch.arange(R), torch.zeros(R, k, V)  # the step's q, cut to each width

    def launch() -> None:
        for width in range(k + 1):
            for lengths in (None, torch.full((R,), width)):
                verify.verify_sampling_fused(torch.zeros(R, width, dtype=torch.long),
                                             probs[:, :width], torch.zeros(R, width + 1, V),
                                             rows, 1.0, rows, rows, 1 << 20, lengths)
        verify.verify_sampling_fused(torch.zeros(R, 0, dtype=torch.long), torch.zeros(R, 0, V),
                                     torch.zeros(R, 1, V), rows, 1.0, rows, rows, 1 << 20)
    keys: dict[bool, set[str]] = {}
    for constexprs, key in h200_specializations(module, "verify_kernel", launch):
        keys.setdefault(constexprs["HAS_LENGTHS"], set()).add(key)
    assert {has: len(found) for has, found in keys.items()} == {False: compiles,
                                                                True: compiles}, keys
