"""The certified Markov walk (``kernels.markov.certified_markov_walk``) against the full
walk: the same ids, while it reads fewer rows of W2 where the base logits leave few
columns a chance."""

import pytest
import torch

from dspark_compile import kernels
from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import lane_config
from dspark_compile.model.heads import row_norms
from dspark_compile.kernels import markov
from test_markov_walk import GPU_ROUNDING

NO_TRITON = "Triton is not installed (the CPU wheels of torch come without it)"

# Triton's interpreter on the CPU, one program (its programs run one after another, and the
# certified step waits for all at its barrier), a streamed launch of 64-column tiles over
# 320 columns: the certified kernel against markov_loop. W2's rows and the base logits
# repeat across tiles (exact ties the first column must win), one round puts its winner in
# the last column, odd rows sample at T = 0.8, and wide base logits leave few contenders.
INTERPRETED = GPU_ROUNDING + """
from dspark_compile.model.heads import row_norms
lane = lane_config("tiny_d2t", draft_vocab_size=320)
drafter = random_drafter(lane, "cpu", seed=3)
head = drafter.markov_head
V = lane.draft_vocab_size
with torch.no_grad():
    head.markov_w2.weight[192:224] = head.markov_w2.weight[0:32]
w1, w2 = head.markov_w1.weight, head.markov_w2.weight
default = markov.launch.launch_shape
markov.launch.launch_shape = lambda *s: markov.launch.Launch(default(*s).rows, 64, 4, 1)
g = torch.Generator().manual_seed(0)
report = dict(differ=0, ties=0, ids=0, read=0, rows=0)
for R, scale, last in ((1, 4, False), (1, 4, True), (5, 4, False), (5, 0.25, False)):
    base = (torch.randint(-6, 6, (R, lane.k, V), generator=g) * scale).bfloat16()
    base[..., 192:224] = base[..., 0:32]
    if last:
        base[..., V - 1] = 40
    anchor = torch.randint(0, lane.target_vocab_size, (R,), generator=g)
    temperature = torch.tensor([0.0, 0.8] * R)[:R]
    seed, anchor_pos = torch.arange(R) * 7, torch.arange(R) + 40
    h = torch.zeros(R, lane.k, lane.hidden_size, dtype=torch.bfloat16)
    with torch.no_grad():
        ids, _, z = markov_loop(drafter, h, base, None, anchor, temperature, seed, anchor_pos)
    got, read = markov.certified_markov_walk(w1.float(), w2.float(), row_norms(w2),
                                             base.float(), anchor, temperature, seed,
                                             anchor_pos, drafter.d2t)
    top = z.float()
    report["ties"] += int(((top == top.max(-1, keepdim=True).values).sum(-1) > 1)[0::2].sum())
    report["differ"] += int((got != ids).sum())
    report["ids"] += ids.numel()
    report["read"] += int(read.sum())
    report["rows"] += lane.k * V
print(json.dumps(report))
"""


@pytest.mark.skipif(not kernels.HAS_TRITON, reason=NO_TRITON)
def test_the_certified_walk_matches_the_loop_in_the_triton_interpreter(interpreted_report):
    report = interpreted_report(INTERPRETED)
    assert report["ties"] > 0, report  # greedy rows met exact ties to break
    assert report["differ"] == 0, report
    assert report["read"] < report["rows"] / 2, report  # the wide rounds read little


def random_walk(V: int, rank: int, device, seed: int):
    g = torch.Generator(device=device).manual_seed(seed)
    w1 = torch.randn(V, rank, generator=g, device=device).bfloat16()
    w2 = (torch.randn(V, rank, generator=g, device=device) * rank ** -0.5).bfloat16()
    return g, w1, w2


@pytest.mark.parametrize("rows", [1, 3, 16, 20])
def test_on_cuda_the_certified_walk_is_the_full_walk(device, rows):
    """A streamed vocabulary (65,536 columns of rank 256 do not fit on chip), 12 rounds each
    of narrow and wide base logits, greedy and sampled rows, W2's rows and the base logits
    repeated across tiles and programs, and rounds whose winner is the last column: the
    ids of the fused full walk, every one. Wide logits read a fraction of W2; past 16 rows
    the op runs the full walk and says it read all of it."""
    if device.type != "cuda":
        pytest.skip("the kernel runs on CUDA; its CPU check is the interpreter's")
    V, rank, k = 65536, 256, 4
    g, w1, w2 = random_walk(V, rank, device, seed=rows)
    w2[40000:40512] = w2[100:612]
    norms = row_norms(w2)
    fraction = {}
    for scale in (1.0, 16.0):
        read = 0
        for trial in range(12):
            base = (torch.randn(rows, k, V, generator=g, device=device) * scale).bfloat16()
            base[..., 40000:40512] = base[..., 100:612]
            if trial % 4 == 3:
                base[..., V - 1] = base.float().amax(-1) + 8
            anchor = torch.randint(0, V, (rows,), generator=g, device=device)
            temperature = (torch.arange(rows, device=device) % 2).float() * 0.8
            seed = torch.arange(rows, device=device) + trial
            position = torch.full((rows,), 100 + trial, device=device)
            full = markov.markov_walk(w1, w2, base, anchor, temperature, seed, position, None)
            ids, rows_read = markov.certified_markov_walk(w1, w2, norms, base, anchor,
                                                          temperature, seed, position, None)
            assert torch.equal(ids, full), (scale, trial)
            read += int(rows_read.sum())
        fraction[scale] = read / (12 * k * V)
    if rows > markov.launch.CERTIFIED_ROWS:
        assert fraction == {1.0: 1.0, 16.0: 1.0}
    else:
        assert fraction[16.0] < 0.5, fraction


# a vocabulary the walk streams (65,536 columns of rank 256 do not fit on chip)
STREAMED = dict(certified_markov_walk=True, fused_markov_step=True, markov_rank=256,
                target_vocab_size=65536, draft_vocab_size=65536)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_certified_lane_matches_the_host_path(both_paths, device, batch, temperature):
    if device.type != "cuda":
        pytest.skip("the kernel runs on CUDA; elsewhere a certified lane keeps the loop")
    drafter = random_drafter(lane_config("tiny", **STREAMED), device, seed=batch)
    for (ids, confidences), ref in both_paths(drafter, batch, 300, 4, seed=5,
                                              temperature=temperature):
        assert torch.equal(ids.cpu(), ref.ids)
        assert torch.equal(confidences.cpu(), ref.confidences)


@pytest.mark.parametrize("backend", ["inductor", "aoti"])
def test_compiled_artifacts_of_a_certified_lane_are_token_identical(built_artifact,
                                                                    fresh_verify, device,
                                                                    backend):
    if device.type != "cuda":
        pytest.skip("the kernel runs on CUDA; elsewhere a certified lane keeps the loop")
    artifact = built_artifact(backend, "tiny", **STREAMED)
    code, report, stderr = fresh_verify(artifact, "temperature=1.0", "rounds=8")
    assert code == 0, stderr
    assert report["identical"] and report["tokens_compared"] > 0


def test_the_exported_program_calls_the_certified_walk(device, exported_targets):
    if device.type != "cuda":
        pytest.skip("the kernel runs on CUDA; elsewhere a certified lane keeps the loop")
    targets = exported_targets(lane_config("tiny", **STREAMED), device)
    assert targets.count(torch.ops.dspark.certified_markov_walk.default) == 1
    assert torch.ops.dspark.markov_walk.default not in targets
