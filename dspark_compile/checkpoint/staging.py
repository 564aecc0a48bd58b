"""A safetensors file onto a device at the speed of the disk, checked as it is read.

The file's bytes are read in spans by a pool of threads (``os.preadv``, hashlib and CUDA
synchronisation all release the GIL). On a GPU each thread reads into a pinned buffer of its
own and copies it to one device buffer holding the whole file (safetensors' own loader
copies each tensor from pageable memory, at a fraction of the pinned rate); on a CPU it
reads straight into that buffer. Given a sha256 for each span, every span is hashed in the
same pass, and the file's header is parsed and its tensors cut only once every span
matches: no byte of the file is used unchecked. The header is a 64-bit length, then JSON
with each tensor's dtype, shape and byte range: the format's whole layout."""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Optional, Sequence

import torch
from torch import Tensor

from dspark_compile.errors import ChecksumError

STAGE_BYTES = 64 << 20
WORKERS = 8
DTYPES = {"BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16,
          "I32": torch.int32, "I64": torch.int64, "F16": torch.float16,
          "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}
Span = tuple[int, int, Optional[str]]  # offset, length, sha256 (None: unchecked)


def read_tensors(path: Path, device: torch.device, names: Optional[Sequence[str]] = None,
                 spans: Optional[Sequence[Span]] = None) -> dict[str, Tensor]:
    """The tensors ``names`` (default: all) of the safetensors file ``path`` on ``device``,
    each in storage of its own. ``spans`` must cover the file exactly, and each span's bytes
    must match its sha256, else :class:`ChecksumError` and no tensor."""
    device = torch.device(device)
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if spans is None:
            spans = [(offset, min(STAGE_BYTES, size - offset), None)
                     for offset in range(0, size, STAGE_BYTES)]
        elif not _cover(spans, size):
            raise ChecksumError(f"{path}: {size} bytes, not the bytes its sha256 spans cover")
        data = torch.empty(size, dtype=torch.uint8, device=device)
        reader = _Reader(f.fileno(), data, path)
        with concurrent.futures.ThreadPoolExecutor(min(WORKERS, len(spans) or 1)) as pool:
            matches = list(pool.map(reader.read_span, spans))
    failed = [span for span, ok in zip(spans, matches) if not ok]
    if failed:
        offset, length, _ = failed[0]
        raise ChecksumError(f"{path}: bytes {offset}-{offset + length} of {size} (and "
                            f"{len(failed) - 1} more spans) fail their sha256 check")
    return _cut(data, names, path)


def read_ahead(path: Path) -> None:
    """Have the kernel read ``path`` into the page cache on a thread of its own, so the
    disk works while the caller does other things (starts CUDA, checks other files)."""
    def advise() -> None:
        try:
            with open(path, "rb") as f:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass  # only a hint: the read that follows reports what is wrong
    if hasattr(os, "posix_fadvise"):
        threading.Thread(target=advise, daemon=True).start()


class _Reader:
    """Reads spans of a file into ``data``; on a GPU through a pinned buffer and a stream of
    each thread's own."""

    def __init__(self, fd: int, data: Tensor, path: Path):
        self.fd, self.data, self.path = fd, data, path
        self.local = threading.local()

    def read_span(self, span: Span) -> bool:
        offset, length, expected = span
        digest = hashlib.sha256()
        for start in range(offset, offset + length, STAGE_BYTES):
            n = min(STAGE_BYTES, offset + length - start)
            if self.data.device.type == "cpu":  # straight into the file's buffer
                buffer, stream = self.data[start:start + n], None
            else:
                buffer, stream = self._staging()
            view = memoryview(buffer.numpy())[:n]
            self._pread(view, start)
            digest.update(view)
            if stream is not None:
                with torch.cuda.stream(stream):
                    self.data[start:start + n].copy_(buffer[:n], non_blocking=True)
                stream.synchronize()  # before this thread's buffer is read into again
        return expected is None or digest.hexdigest() == expected

    def _staging(self) -> tuple[Tensor, torch.cuda.Stream]:
        if not hasattr(self.local, "buffer"):
            n = min(STAGE_BYTES, self.data.numel())
            self.local.buffer = torch.empty(n, dtype=torch.uint8, pin_memory=True)
            self.local.stream = torch.cuda.Stream(self.data.device)
        return self.local.buffer, self.local.stream

    def _pread(self, view: memoryview, offset: int) -> None:
        got = 0
        while got < len(view):
            n = os.preadv(self.fd, [view[got:]], offset + got)
            if not n:
                raise ValueError(f"{self.path}: the file ends before its header says")
            got += n


def _cut(data: Tensor, names: Optional[Sequence[str]], path: Path) -> dict[str, Tensor]:
    """The tensors the header at the start of ``data`` places, each cloned: aligned for its
    dtype, and the file's buffer can go."""
    size = data.numel()
    if size < 8:
        raise ValueError(f"{path}: the file ends before its header says")
    header_bytes = int.from_bytes(bytes(data[:8].cpu().numpy()), "little")
    if 8 + header_bytes > size:
        raise ValueError(f"{path}: the file ends before its header says")
    header = json.loads(bytes(data[8:8 + header_bytes].cpu().numpy()))
    header.pop("__metadata__", None)
    base = 8 + header_bytes
    tensors = {}
    for name in header if names is None else names:
        entry = header[name]
        begin, end = (base + offset for offset in entry["data_offsets"])
        if end > size:
            raise ValueError(f"{path}: the file ends before its header says")
        tensors[name] = data[begin:end].clone().view(DTYPES[entry["dtype"]]).view(entry["shape"])
    if data.device.type == "cuda":
        torch.cuda.current_stream(data.device).synchronize()
    return tensors


def _cover(spans: Sequence[Span], size: int) -> bool:
    """Whether ``spans`` follow each other from byte 0 to byte ``size``."""
    end = 0
    for offset, length, _ in spans:
        if offset != end or length < 0:
            return False
        end += length
    return end == size
