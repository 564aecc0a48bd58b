import os

import pytest
import torch

from dspark_compile.draft import DraftStep, KVCache
from dspark_compile.reference import HostPath
from dspark_compile.rounds import context_needed, synthetic_rounds

# DSPARK_TEST_DEVICE=cuda runs the same tests on a GPU
DEVICE = torch.device(os.environ.get("DSPARK_TEST_DEVICE", "cpu"))


@pytest.fixture
def device() -> torch.device:
    return DEVICE


def run_both_paths(drafter, batch: int, context: int, rounds: int, seed: int, step=None):
    """Yield (device-path ids, confidences), host-path result, per seeded round.

    ``step(k_cache, v_cache, *inputs)`` is the device path; default: the eager draft step.
    Both paths start from the same zeroed cache and see the same rounds.
    """
    lane, device = drafter.lane, drafter.fc.weight.device
    step = DraftStep(drafter) if step is None else step
    cache = KVCache.allocate(lane, batch, device, context_needed(lane, context, rounds))
    host_cache = cache.clone()
    host = HostPath(drafter)
    with torch.no_grad():
        for inputs in synthetic_rounds(lane, batch, context, rounds, seed, device):
            ids, confidences = step(cache.k, cache.v, *inputs.tensors())[:2]
            yield (ids, confidences), host.draft(host_cache, inputs)


@pytest.fixture
def both_paths():
    return run_both_paths
