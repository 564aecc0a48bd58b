"""The one-pass read of a safetensors file onto a device (through pinned buffers on a GPU),
against safetensors' own loader, and its sha256 spans against hashlib over the file."""

import hashlib

import pytest
import torch
from safetensors.torch import load_file, save_file

from dspark_compile.checkpoint import staging
from dspark_compile.errors import ChecksumError


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


def spans_of(path, chunk):
    """Each ``chunk`` bytes of the file with its sha256, by hashlib."""
    data = path.read_bytes()
    return [(i, len(data[i:i + chunk]), hashlib.sha256(data[i:i + chunk]).hexdigest())
            for i in range(0, len(data), chunk)]


def assert_same_tensors(got, expected):
    assert sorted(got) == sorted(expected)
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert got[name].device == tensor.device
        assert torch.equal(got[name].reshape(-1).view(torch.uint8),
                           tensor.reshape(-1).view(torch.uint8)), name  # the bits


@pytest.mark.parametrize("stage_bytes", [staging.STAGE_BYTES, 24])
def test_the_tensors_equal_safetensors_own(mixed_file, device, monkeypatch, stage_bytes):
    monkeypatch.setattr(staging, "STAGE_BYTES", stage_bytes)  # 24: many stages, a part one
    expected = load_file(str(mixed_file), device=str(device))
    assert_same_tensors(staging.read_tensors(mixed_file, device, sorted(expected)), expected)
    assert_same_tensors(staging.read_tensors(mixed_file, device), expected)  # all by default


@pytest.mark.parametrize("chunk", [100, 1 << 20])  # many spans, or one for the whole file
def test_spans_that_match_give_the_tensors(mixed_file, device, monkeypatch, chunk):
    monkeypatch.setattr(staging, "STAGE_BYTES", 24)  # each span read in several stages
    expected = load_file(str(mixed_file), device=str(device))
    got = staging.read_tensors(mixed_file, device, spans=spans_of(mixed_file, chunk))
    assert_same_tensors(got, expected)


@pytest.mark.parametrize("where", ["header", "last tensor"])
def test_a_damaged_byte_fails_its_span_before_anything_is_parsed(mixed_file, device, where):
    spans = spans_of(mixed_file, 100)
    data = bytearray(mixed_file.read_bytes())
    data[10 if where == "header" else len(data) - 1] ^= 0xFF  # in the header: invalid JSON
    mixed_file.write_bytes(bytes(data))
    first = 0 if where == "header" else spans[-1][0]
    with pytest.raises(ChecksumError, match=f"bytes {first}-"):
        staging.read_tensors(mixed_file, device, spans=spans)


@pytest.mark.parametrize("change", ["cut", "appended"])
def test_a_file_the_spans_do_not_cover_is_refused(mixed_file, device, change):
    spans = spans_of(mixed_file, 100)
    data = mixed_file.read_bytes()
    mixed_file.write_bytes(data[:-1] if change == "cut" else data + b"\0")
    with pytest.raises(ChecksumError, match="not the bytes its sha256 spans cover"):
        staging.read_tensors(mixed_file, device, spans=spans)


def test_a_file_shorter_than_its_header_says_is_refused(mixed_file, device):
    data = mixed_file.read_bytes()
    mixed_file.write_bytes(data[:-5])
    with pytest.raises(ValueError, match="ends before"):
        staging.read_tensors(mixed_file, device, ["flag"])
