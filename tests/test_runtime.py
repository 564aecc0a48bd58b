import subprocess
import sys

import pytest
import torch

from dspark_compile.draft import RoundInputs
from dspark_compile.errors import InputError
from dspark_compile.rounds import synthetic_rounds
from dspark_compile.runtime import load_runner

FRESH = """
import sys
from dspark_compile import load_runner
runner = load_runner(sys.argv[1], sys.argv[2])
print(runner.buckets, "hydra" in sys.modules, "onnxruntime" in sys.modules)
"""


def test_load_runner_in_a_fresh_process_imports_no_hydra(built_artifact, device):
    artifact = built_artifact("eager", "tiny")
    result = subprocess.run([sys.executable, "-c", FRESH, str(artifact), device.type],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[3]", "False", "False"]


def test_batch_above_the_largest_bucket_is_an_error(built_artifact, device):
    runner = load_runner(built_artifact("eager", "tiny"), device)
    inputs = next(synthetic_rounds(runner.lane, 4, 16, 1, 0, device))
    with pytest.raises(InputError, match=r"batch: 4 requests; allowed: \[1, 3\]"):
        runner.draft(inputs)


def test_padding_rows_do_not_change_the_real_rows(built_artifact, device):
    """One request drafted alone in bucket 3 (two inert rows) equals the same request drafted
    in a full batch of three, whatever the other two rows hold."""
    alone = load_runner(built_artifact("eager", "tiny"), device)
    full = load_runner(built_artifact("eager", "tiny"), device)
    lane = alone.lane
    for inputs in synthetic_rounds(lane, 3, 20, 3, 1, device):
        first = RoundInputs(*(t[:1] for t in inputs.tensors()))
        a, b = alone.draft(first), full.draft(inputs)
        assert torch.equal(a.ids, b.ids[:1])
        assert torch.equal(a.confidences, b.confidences[:1])
