import numpy as np
import torch

from dspark_compile.speculative import verify_greedy, verify_sampling


def test_greedy_accepts_the_longest_matching_prefix_then_the_target_token():
    draft = torch.tensor([[5, 6, 7], [1, 2, 3], [9, 9, 9]])
    target = torch.tensor([[5, 6, 8, 4], [1, 2, 3, 0], [2, 9, 9, 1]])
    accepted, tokens = verify_greedy(draft, target)
    assert accepted.tolist() == [2, 3, 0]
    emitted = [tokens[r, :a + 1].tolist() for r, a in enumerate(accepted.tolist())]
    assert emitted == [[5, 6, 8], [1, 2, 3, 0], [2]]


def chi_square(counts, probs):
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_speculative_sampling_emits_the_target_distribution():
    """Whatever q proposes, the first emitted token follows p_0 (the scheme is lossless)."""
    rng = np.random.default_rng(0)
    V, k, trials = 5, 2, 60_000
    p = torch.tensor(rng.dirichlet(np.ones(V), size=k + 1))
    q = torch.tensor(rng.dirichlet(np.ones(V), size=k))
    draft = torch.stack([torch.tensor(rng.choice(V, size=trials, p=q[i].numpy()))
                         for i in range(k)], 1)
    accepted, tokens = verify_sampling(draft, q.expand(trials, k, V), p.expand(trials, k + 1, V),
                                       torch.arange(trials), torch.full((trials,), 7))
    counts = np.bincount(tokens[:, 0].numpy(), minlength=V)
    assert chi_square(counts, p[0].numpy()) < 18.5  # 4 degrees of freedom, 99.9th pct
    # acceptance of draft 0 happens with probability sum_x min(p_0(x), q_0(x))
    rate = float((accepted >= 1).double().mean())
    assert abs(rate - float(torch.minimum(p[0], q[0]).sum())) < 0.01


def test_full_acceptance_adds_a_bonus_token_from_the_last_target_row():
    V, k, trials = 4, 2, 40_000
    q = torch.full((trials, k, V), 1 / V, dtype=torch.float64)
    p_last = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    p = torch.cat([q, p_last.expand(trials, 1, V)], 1)
    draft = torch.randint(0, V, (trials, k), generator=torch.Generator().manual_seed(1))
    accepted, tokens = verify_sampling(draft, q, p, torch.arange(trials),
                                       torch.zeros(trials, dtype=torch.long))
    assert bool((accepted == k).all())  # p == q: every draft is accepted
    assert torch.equal(tokens[:, :k], draft)
    counts = np.bincount(tokens[:, k].numpy(), minlength=V)
    assert chi_square(counts, p_last.numpy()) < 16.3  # 3 degrees of freedom


def test_greedy_drafts_are_verified_exactly_by_a_one_hot_target():
    draft = torch.tensor([[2, 3, 1]])
    q = torch.nn.functional.one_hot(draft, 4).double()
    p = torch.nn.functional.one_hot(torch.tensor([[2, 3, 0, 1]]), 4).double()
    accepted, tokens = verify_sampling(draft, q, p, torch.tensor([0]), torch.tensor([0]))
    assert accepted.tolist() == [2] and tokens[0, :3].tolist() == [2, 3, 0]


def test_a_correction_is_never_a_token_the_residual_gives_no_mass():
    # p on a few scattered tokens, q on others: after a rejection the correction comes from
    # p's support less q's, whatever the noise (the first and the last token included)
    V, trials = 64, 4_000
    generator = torch.Generator().manual_seed(3)
    support = [0, 17, 40, 63]
    p = torch.zeros(trials, 2, V, dtype=torch.float64)
    p[:, :, support] = torch.rand(trials, 2, len(support), generator=generator,
                                  dtype=torch.float64)
    p /= p.sum(-1, keepdim=True)
    q = torch.zeros(trials, 1, V, dtype=torch.float64)
    q[:, 0, 5] = 1.0  # a draft p never makes: always rejected
    draft = torch.full((trials, 1), 5)
    accepted, tokens = verify_sampling(draft, q, p, torch.arange(trials),
                                       torch.full((trials,), 3))
    assert bool((accepted == 0).all())
    corrections = tokens[:, 0]
    assert set(corrections.tolist()) == set(support)
