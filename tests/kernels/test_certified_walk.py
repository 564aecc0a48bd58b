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

# Triton's interpreter on the CPU (its programs run one after another), a streamed launch of
# 64-column tiles over 320 columns, in two grids: one program taking all 5 tiles, and
# programs of 2 tiles (the last one's run cut short): the certified kernel against
# markov_loop. W2's rows and the base logits repeat across tiles (exact ties the first
# column must win), one round puts its winner in the last column, odd rows sample at
# T = 0.8, and wide base logits leave few contenders: those rounds read only the tiles
# that can win, narrow ones read whole runs.
INTERPRETED = GPU_ROUNDING + """
import sys
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
run = int(sys.argv[1])
markov.launch.grid = lambda launch, tiles, sms: (-(-tiles // run), run)
g = torch.Generator().manual_seed(0)
report = dict(differ=0, ties=0, ids=0, read={})
# (requests, base scale, how the base is led): by one column per request (5 + 7 r, whose
# copy at 192 + 5 + 7 r ties it), by the last column, or by nothing (integers that tie)
for R, scale, lead in ((1, 16, "tied"), (5, 16, "tied"), (1, 4, "last"), (1, 4, "none"),
                       (5, 0.25, "none")):
    noise = torch.randn if lead == "tied" else lambda *s, **o: torch.randint(-6, 6, s, **o)
    base = (noise(R, lane.k, V, generator=g) * scale).bfloat16()
    if lead == "tied":
        for r in range(R):
            base[r, :, 5 + 7 * r] = base[r].float().amax() + 30
    base[..., 192:224] = base[..., 0:32]
    if lead == "last":
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
    report["read"][f"{R} {lead}"] = int(read.sum()) / (lane.k * V)
print(json.dumps(report))
"""


@pytest.mark.skipif(not kernels.HAS_TRITON, reason=NO_TRITON)
@pytest.mark.parametrize("run", [5, 2])
def test_the_certified_walk_matches_the_loop_in_the_triton_interpreter(interpreted_report,
                                                                       run):
    report = interpreted_report(INTERPRETED, str(run))
    assert report["ties"] > 0, report  # greedy rows met exact ties to break
    assert report["differ"] == 0, report
    read = report["read"]
    # led: 2 of 5 tiles, a few of their columns; no lead: most tiles, most runs whole
    assert max(read["1 tied"], read["5 tied"], read["1 last"]) < 0.1, report
    assert min(read["5 none"], read["1 none"]) > 0.5, report


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
    else:  # 16 rows' contending tiles together leave fewer runs to skip
        assert fraction[16.0] < (0.75 if rows == 16 else 0.5), fraction


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


# The certified step's tile bounds (bounds.py), from the pre-pass's tile maxima, against
# every column's score recomputed in full (the bias from the whole product in bf16, the sum
# rounded, a sampled row's noise in float64): no score in a tile exceeds its bound, for
# greedy rows and rows sampling at T = 0.7 and 1.3, W2's first rows along e (Cauchy-Schwarz
# tight, and its largest row where the tile's largest U is: the greedy bound is nearly
# reached there) at magnitudes from small to larger than the base logits, in Triton's
# interpreter.
TILE_BOUNDS = GPU_ROUNDING + """
import torch.nn.functional as F
import triton
from dspark_compile.draft.sampling import rounded
from dspark_compile.kernels.markov import bounds, tiles
from dspark_compile.model.heads import row_norms
from dspark_compile.rng import gumbel

@triton.jit
def _bounds_kernel(top_ptr, size_ptr, norm_top_ptr, e_ptr, temperature_ptr, seed_ptr,
                   position_ptr, out_ptr, k, step, TILES: tl.constexpr, RANK: tl.constexpr,
                   R: tl.constexpr):
    rows = tl.arange(0, R)
    t, hot, any_hot, key = tiles._row_inputs(temperature_ptr, seed_ptr, position_ptr, rows,
                                             rows < R)
    e = tl.load(e_ptr + rows[:, None] * RANK + tl.arange(0, RANK)[None, :])
    e_norm = tl.sqrt(tl.sum(e * e, axis=1))
    at = (rows[:, None] * k + step) * TILES + tl.arange(0, TILES)[None, :]
    bound = bounds._tile_bounds(tl.load(top_ptr + at), tl.load(size_ptr + at),
                                tl.load(norm_top_ptr + tl.arange(0, TILES)), e_norm, t, hot,
                                any_hot)
    tl.store(out_ptr + rows[:, None] * TILES + tl.arange(0, TILES)[None, :], bound)

R, k, V, rank, block = 4, 2, 1024, 64, 128
tiles_ = V // block
g = torch.Generator().manual_seed(0)
temperature = torch.tensor([0.0, 0.7, 0.0, 1.3])
seed, position = torch.arange(R) + 3, torch.arange(R) + 50
worst = dict(greedy=-float("inf"), sampled=-float("inf"), tight=0.0, checked=0)
for trial in range(6):
    e = torch.randn(R, rank, generator=g).bfloat16()
    w2 = torch.randn(V, rank, generator=g).mul(0.3).bfloat16()
    scale = (0.5, 4.0, 32.0)[trial % 3]
    for r in range(R):  # rows along e in one tile each: the bound is tight there
        w2[r * block:r * block + 16] = (e[r].float() * torch.linspace(-scale, scale, 16)[:, None]
                                        ).bfloat16()
    base = torch.randn(R, k, V, generator=g).mul(4.0).bfloat16()
    for r in range(R):
        base[r, :, r * block + 15] = base[r, :, r * block:(r + 1) * block].float().amax(-1) + 1
    norms = row_norms(w2)
    top = torch.empty(R, k, tiles_); size = torch.empty_like(top); norm_top = torch.empty(tiles_)
    candidates = torch.full((R, k, 1), -(1 << 63))
    bounds._tile_maxima_kernel[(R * k, 1)](base.float(), temperature, seed, position, norms,
                                           top, size, norm_top, candidates, V, k, tiles_,
                                           base.stride(0), BLOCK=block, GROUP=tiles_,
                                           SEGMENT=1, C=1)
    for step in range(k):
        out = torch.empty(R, tiles_)
        _bounds_kernel[(1,)](top, size, norm_top, e.float(), temperature, seed, position, out,
                             k, step, TILES=tiles_, RANK=rank, R=R)
        z = rounded(base[:, step].float() + F.linear(e, w2).float(), torch.bfloat16).double()
        noise = gumbel(seed, position, step, V)
        hot = temperature > 0
        score = torch.where(hot[:, None], z / torch.where(hot, temperature, 1.0).double()[:, None]
                            + noise, z)
        over = score.view(R, tiles_, block).amax(-1) - out.double()
        worst["greedy"] = max(worst["greedy"], over[~hot].max().item())
        worst["sampled"] = max(worst["sampled"], over[hot].max().item())
        tight = torch.stack([over[r, r] / (1 + score[r].abs().max()) for r in (0, 2)])
        worst["tight"] = min(worst["tight"], tight.min().item())
        worst["checked"] += over.numel()
print(json.dumps(worst))
"""


@pytest.mark.skipif(not kernels.HAS_TRITON, reason=NO_TRITON)
def test_no_score_in_a_tile_exceeds_its_bound(interpreted_report):
    worst = interpreted_report(TILE_BOUNDS)
    assert worst["greedy"] <= 0 and worst["sampled"] <= 0, worst
    assert worst["checked"] == 6 * 2 * 4 * 8
    assert worst["tight"] > -0.02, worst  # where Cauchy-Schwarz is tight, so is the bound
