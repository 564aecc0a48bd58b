import numpy as np
import torch

from dspark_compile.rng import gumbel, uniform


def chi_square(counts: np.ndarray) -> float:
    expected = counts.sum() / counts.size
    return float(((counts - expected) ** 2 / expected).sum())


def test_uniform_is_uniform_and_open_on_both_ends():
    u = uniform(torch.tensor([0, 7, (1 << 32) - 1]), torch.tensor([0, 100, 4096]), 2, 200_000)
    assert float(u.min()) > 0 and float(u.max()) < 1
    for row in u.numpy():
        counts = np.histogram(row, bins=50, range=(0, 1))[0]
        # chi-square with 49 degrees of freedom: the 99.9th percentile is about 85.4
        assert chi_square(counts) < 85.4


def test_streams_differ_by_every_key_and_are_uncorrelated():
    base = uniform(torch.tensor([1]), torch.tensor([10]), 0, 50_000)[0]
    for other in (uniform(torch.tensor([2]), torch.tensor([10]), 0, 50_000)[0],
                  uniform(torch.tensor([1]), torch.tensor([11]), 0, 50_000)[0],
                  uniform(torch.tensor([1]), torch.tensor([10]), 1, 50_000)[0]):
        assert not torch.equal(base, other)
        assert abs(float(np.corrcoef(base.numpy(), other.numpy())[0, 1])) < 0.02


def test_a_keys_noise_is_the_same_in_any_batch():
    """No state: each row's noise is a function of its own keys, whatever rows are drawn
    beside it and in whatever order (a generator with a position would fail this)."""
    seeds, positions = torch.tensor([3, 4, 9]), torch.tensor([5, 6, 2])
    batch = gumbel(seeds, positions, 7, 1000)
    for i in range(3):
        alone = gumbel(seeds[i:i + 1], positions[i:i + 1], 7, 1000)
        assert torch.equal(alone[0], batch[i])
    reversed_rows = gumbel(seeds.flip(0), positions.flip(0), 7, 1000)
    assert torch.equal(reversed_rows.flip(0), batch)


def test_gumbel_max_samples_the_softmax():
    logits = torch.tensor([0.0, 1.0, -0.5, 2.0], dtype=torch.float64)
    draws = 40_000
    noise = gumbel(torch.arange(draws), torch.zeros(draws, dtype=torch.long), 0, 4)
    counts = np.bincount((logits + noise).argmax(-1).numpy(), minlength=4)
    expected = torch.softmax(logits, 0).numpy() * draws
    statistic = float(((counts - expected) ** 2 / expected).sum())
    assert statistic < 16.3  # chi-square, 3 degrees of freedom, 99.9th percentile
