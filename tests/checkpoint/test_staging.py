"""The staged copy of a safetensors file to the GPU against safetensors' own loader."""

import pytest
import torch
from safetensors.torch import load_file, save_file

from dspark_compile.checkpoint import staging


@pytest.fixture
def mixed_file(tmp_path):
    """Tensors of every width the lanes use and some they do not, with odd byte counts
    (a 1-byte tensor before 8-byte ones), a 0-d tensor and an empty one."""
    gen = torch.Generator().manual_seed(0)
    tensors = {
        "flag": torch.tensor([True, False, True]),
        "bytes": torch.randint(0, 255, (7,), generator=gen, dtype=torch.uint8),
        "w.bf16": torch.randn(13, 5, generator=gen).to(torch.bfloat16),
        "w.f32": torch.randn(3, 7, generator=gen),
        "d2t": torch.randint(-9, 9, (11,), generator=gen),
        "scale": torch.tensor(2.5, dtype=torch.float64),
        "none": torch.empty(0, 4, dtype=torch.float16),
    }
    path = tmp_path / "mixed.safetensors"
    save_file(tensors, str(path))
    return path


@pytest.mark.parametrize("stage_bytes", [staging.STAGE_BYTES, 24])
def test_staged_tensors_equal_safetensors_own(mixed_file, device, monkeypatch, stage_bytes):
    if device.type != "cuda":
        pytest.skip("the staged copy is the CUDA path; on a CPU load_weights maps the file")
    monkeypatch.setattr(staging, "STAGE_BYTES", stage_bytes)  # 24: many stages, a part one
    expected = load_file(str(mixed_file), device=str(device))
    got = staging.read_to_device(mixed_file, sorted(expected), device)
    assert sorted(got) == sorted(expected)
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert got[name].device == tensor.device
        assert torch.equal(got[name].reshape(-1).view(torch.uint8),
                           tensor.reshape(-1).view(torch.uint8)), name  # the bits


def test_a_file_shorter_than_its_header_says_is_refused(mixed_file, device):
    if device.type != "cuda":
        pytest.skip("the staged copy is the CUDA path; on a CPU load_weights maps the file")
    data = mixed_file.read_bytes()
    mixed_file.write_bytes(data[:-5])
    with pytest.raises(ValueError, match="ends before"):
        staging.read_to_device(mixed_file, ["flag"], device)
