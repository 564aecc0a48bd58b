"""The certified walk's reference (``draft/certified.py``): its bound against every logit
recomputed in full, and its ids against the full walk's (``markov_loop``)."""

import pytest
import torch
import torch.nn.functional as F

from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import lane_config
from dspark_compile.draft import certified
from dspark_compile.draft.certified import certified_walk, upper_bounds
from dspark_compile.model.heads import row_norms
from dspark_compile.draft.markov import markov_loop
from dspark_compile.draft.sampling import rounded


def full_logits(w2, e, base):
    """Every column's logit as the full walk computes it: the whole bias, then the sum."""
    return rounded(base.float() + F.linear(e, w2).float(), base.dtype)


def tight_case(rows: int = 64, rank: int = 64, seed: int = 0):
    """W2's rows along e, so Cauchy-Schwarz holds with equality, at magnitudes whose sums
    sit on bf16 rounding boundaries."""
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(1, rank, generator=g).bfloat16()
    w2 = (e.float() * torch.linspace(0.1, 8.0, rows)[:, None]).bfloat16()
    base = torch.randn(1, rows, generator=g).mul(64).bfloat16()
    return w2, e, base


@pytest.mark.parametrize("seed", range(4))
def test_no_logit_exceeds_its_bound(seed):
    g = torch.Generator().manual_seed(seed)
    w2 = torch.randn(4096, 64, generator=g).mul(0.2).bfloat16()
    e = torch.randn(3, 64, generator=g).bfloat16()
    base = torch.randn(3, 4096, generator=g).mul(4).bfloat16()
    w2[:64] = (e[0].float() * torch.linspace(-4, 4, 64)[:, None]).bfloat16()  # along e
    for w, x, u in ((w2, e, base), tight_case(seed=seed)):
        assert (full_logits(w, x, u) <= upper_bounds(u, row_norms(w), x)).all()


def test_the_bound_needs_its_slack(monkeypatch):
    """Without the allowance for rounding, rows along e exceed the bare Cauchy-Schwarz
    bound: the slack is what makes it a bound."""
    monkeypatch.setattr(certified, "BOUND_SLACK", 0.0)
    w2, e, base = tight_case()
    assert (full_logits(w2, e, base) > upper_bounds(base, row_norms(w2), e)).any()


def walk_both(drafter, base, temperature, seed=0):
    R = base.shape[0]
    lane, head = drafter.lane, drafter.markov_head
    g = torch.Generator().manual_seed(seed)
    anchor = torch.randint(0, lane.target_vocab_size, (R,), generator=g)
    position = torch.arange(R) + 30
    seeds = torch.arange(R) * 5 + seed
    h = torch.zeros(R, lane.k, lane.hidden_size, dtype=lane.torch_dtype)
    with torch.no_grad():
        full = markov_loop(drafter, h, base, None, anchor, temperature, seeds, position,
                           keep_logits=False)[0]
        w2 = head.markov_w2.weight
        ids, read = certified_walk(head.markov_w1.weight, w2, row_norms(w2), base, anchor,
                                   temperature, seeds, position, drafter.d2t)
    return full, ids, read


@pytest.mark.parametrize("lane_name", ["tiny", "tiny_d2t"])
@pytest.mark.parametrize("scale", [1.0, 16.0])
def test_the_certified_walk_is_the_full_walk(lane_name, scale):
    """40 seeded rounds of 5 requests, greedy and sampled rows, narrow and wide base
    logits: the same ids; the wide ones read under half of W2."""
    lane = lane_config(lane_name)
    V = lane.draft_vocab_size
    temperature = torch.tensor([0.0, 1.0, 0.0, 0.7, 0.0])
    read = 0
    for seed in range(40):
        drafter = random_drafter(lane, "cpu", seed=seed)
        g = torch.Generator().manual_seed(seed)
        base = torch.randn(5, lane.k, V, generator=g).mul(scale).to(lane.torch_dtype)
        full, ids, rows = walk_both(drafter, base, temperature, seed)
        assert torch.equal(ids, full), seed
        read += int(rows.sum())
    if scale > 1:
        assert read < 40 * lane.k * V / 2


def test_ties_across_tiles_and_a_winner_in_the_last_column():
    """Exact ties between columns far apart (the first must win), and rounds whose only
    winner is the last column."""
    lane = lane_config("tiny")
    V = lane.draft_vocab_size
    drafter = random_drafter(lane, "cpu", seed=1)
    with torch.no_grad():
        drafter.markov_head.markov_w2.weight[V // 2:V // 2 + 32] = \
            drafter.markov_head.markov_w2.weight[:32]
    g = torch.Generator().manual_seed(2)
    ties = 0
    for round_ in range(20):
        base = torch.randint(-6, 6, (4, lane.k, V), generator=g).mul(2.0).bfloat16()
        base[..., V // 2:V // 2 + 32] = base[..., :32]
        if round_ % 2:
            base[..., V - 1] = 64
        full, ids, _ = walk_both(drafter, base, torch.tensor([0.0, 0.0, 0.9, 0.0]), round_)
        assert torch.equal(ids, full), round_
        ties += int((ids[[0, 1, 3]] < 32).sum())
        if round_ % 2:
            assert (ids[[0, 1, 3]] == V - 1).all()
    assert ties > 0  # the tied pair's first column won, not its copy


def test_a_dominant_column_is_the_only_row_read():
    """Base logits where one column leads every other by more than any bias can bridge:
    each step scores that column and no other."""
    lane = lane_config("tiny")
    drafter = random_drafter(lane, "cpu", seed=0)
    base = torch.zeros(2, lane.k, lane.draft_vocab_size).bfloat16()
    base[0, :, 7] = 1000
    base[1, :, 300] = 1000
    full, ids, read = walk_both(drafter, base, torch.tensor([0.0, 0.5]))
    assert torch.equal(ids, full)
    # per request its candidate (512 columns are one segment), then itself
    assert read.tolist() == [2 + 2] * lane.k


def test_every_loader_fills_a_certified_lanes_row_norms(tmp_path):
    """Drawn, read back from a checkpoint and cast: ``w2_norms`` is W2's row norms (from
    torch.linalg in float64), rounded up to fp32, never below them."""
    from dspark_compile import load_checkpoint, save_checkpoint
    from dspark_compile.checkpoint.weights import cast_drafter

    lane = lane_config("tiny", certified_markov_walk=True)
    drawn = random_drafter(lane, "cpu", seed=4)
    save_checkpoint(drawn, tmp_path / "drafter", "speculators")
    for drafter in (drawn, load_checkpoint(tmp_path / "drafter", lane),
                    cast_drafter(drawn, "float32")):
        head = drafter.markov_head
        exact = torch.linalg.vector_norm(head.markov_w2.weight.double(), dim=-1)
        assert head.w2_norms.dtype == torch.float32
        assert (head.w2_norms.double() >= exact).all()
        assert torch.allclose(head.w2_norms.double(), exact, rtol=1e-6, atol=0)
    assert not hasattr(random_drafter(lane_config("tiny"), "cpu").markov_head, "w2_norms")
