"""A drafter's weights: seeded random ones for any lane, or tensors read from safetensors
files, every one checked against the lane by name and shape before any is loaded.

Weights are created or loaded straight onto the target device in the lane's dtype (the
27B lane is about 4.4 B parameters: never build it on the CPU first). Nothing is unpickled.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Optional

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from dspark_compile.checkpoint.staging import read_tensors
from dspark_compile.config import LaneConfig
from dspark_compile.errors import CheckpointError
from dspark_compile.model import Drafter
from dspark_compile.model.vocab import random_d2t

CHECKPOINT_WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"


def meta_drafter(lane: LaneConfig, device: torch.device | str) -> Drafter:
    """A drafter of ``lane`` for ``device`` (its ``auto`` fast paths decided for it) with no
    storage: its tensors on the meta device, shapes and dtypes only, until filled
    (``to_empty``, or :func:`load_weights` ``into`` it). On a GPU, cuBLAS then sums bf16
    GEMMs in fp32: its bf16 split-K reduction can differ between two call sites of one GEMM
    (eager vs compiled), and token identity needs the same sums (a process-wide setting,
    made where a drafter for a GPU is, not on import)."""
    if torch.device(device).type == "cuda":
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    lane = lane.for_device(device)
    with torch.device("meta"):
        return Drafter(lane).to(lane.torch_dtype)


def empty_drafter(lane: LaneConfig, device: torch.device | str) -> Drafter:
    """A drafter with uninitialised storage on ``device``, in the lane's dtype (its lane's
    ``auto`` fast paths decided for the device)."""
    drafter = meta_drafter(lane, device)
    drafter.to_empty(device=device)
    drafter.fill_rope_tables()  # the weights' tables wait for the weights
    return drafter.eval()


def cast_drafter(drafter: Drafter, dtype: str) -> Drafter:
    """A copy of ``drafter`` in another dtype (its lane says so too), without the fast
    paths whose kernels do not take that dtype (:meth:`LaneConfig.for_device`)."""
    device = drafter.fc.weight.device
    copy = empty_drafter(drafter.lane.for_device(device, dtype), device)
    copy.load_state_dict(drafter.state_dict())  # copy_ casts
    copy.fill_tables()
    return copy


@torch.no_grad()
def random_drafter(lane: LaneConfig, device: torch.device | str = "cpu", seed: int = 0
                   ) -> Drafter:
    """Seeded random weights, drawn on ``device`` (the same seed differs across devices)."""
    drafter = empty_drafter(lane, device)
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in drafter.named_parameters():
        if name.endswith("norm.weight"):
            p.normal_(1.0, 0.1, generator=gen)
        elif p.dim() == 1:  # biases
            p.normal_(0.0, 0.1, generator=gen)
        elif name in ("embed_tokens.weight", "markov_head.markov_w1.weight"):
            p.normal_(0.0, 1.0, generator=gen)
        else:  # unit-variance outputs for unit-variance inputs
            p.normal_(0.0, p.shape[1] ** -0.5, generator=gen)
    if lane.has_d2t:
        drafter.d2t.copy_(random_d2t(lane.draft_vocab_size, lane.target_vocab_size, gen,
                                     drafter.d2t.device))
    drafter.fill_tables()
    return drafter


def tensor_files(directory: Path) -> dict[str, Path]:
    """Which file of a checkpoint directory holds each tensor: ``model.safetensors``, or
    the shards a ``model.safetensors.index.json`` lists."""
    index = directory / INDEX
    if not index.is_file():
        return {name: directory / CHECKPOINT_WEIGHTS for name in _keys(directory / CHECKPOINT_WEIGHTS)}
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        files = {name: directory / shard for name, shard in weight_map.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(f"{index}: {err}") from err
    if any(path.parent != directory for path in files.values()):
        raise CheckpointError(f"{index}: names a file outside {directory}")
    return files


def _keys(path: Path) -> list[str]:
    try:
        with safe_open(str(path), framework="pt") as f:
            return list(f.keys())
    except (OSError, RuntimeError, ValueError, SafetensorError) as err:
        raise CheckpointError(f"{path}: {err}") from err


def load_weights(lane: LaneConfig, files: Path | dict[str, Path], device: torch.device | str,
                 supplied: Optional[dict[str, Tensor]] = None,
                 ignored: frozenset[str] = frozenset({"t2d"}),
                 into: Optional[Drafter] = None) -> Drafter:
    """A drafter of ``lane`` with the tensors of ``files`` (one safetensors file, or a map of
    tensor name to file), checked key by key. ``supplied`` tensors (the verifier's) take
    the place of file tensors of the same name; ``ignored`` names may sit in the files.
    ``into``, a :func:`meta_drafter` of the lane, is filled and returned instead of a new
    drafter: its modules may already be held (a loaded compiled step's)."""
    supplied = supplied or {}
    lane = lane.for_device(device)
    if isinstance(files, (Path, str)):
        files = {name: Path(files) for name in _keys(Path(files))}
    by_file: dict[Path, list[str]] = {}
    for name, path in files.items():
        if name not in supplied:
            by_file.setdefault(path, []).append(name)
    try:
        # shapes only: absurd sizes fail here, allocating nothing
        drafter = meta_drafter(lane, device) if into is None else into
        expected = {name: tuple(t.shape) for name, t in drafter.state_dict().items()}
        found = {name: tuple(t.shape) for name, t in supplied.items()}
        with ExitStack() as stack:
            handles = {path: stack.enter_context(safe_open(str(path), framework="pt",
                                                           device=str(device)))
                       for path in by_file}
            for path, names in by_file.items():
                found.update({n: tuple(handles[path].get_slice(n).get_shape()) for n in names})
            _check_keys(lane, expected, found, ignored)
            state = {name: t.to(device) for name, t in supplied.items() if name in expected}
            for path, names in by_file.items():
                names = [n for n in names if n in expected]
                if torch.device(device).type == "cuda":
                    state.update(read_tensors(path, torch.device(device), names))
                else:
                    state.update({n: handles[path].get_tensor(n) for n in names})
    except (OSError, RuntimeError, ValueError, OverflowError, SafetensorError) as err:
        if isinstance(err, CheckpointError):
            raise
        raise CheckpointError(f"{', '.join(map(str, by_file))}: {err}") from err
    state = {name: t if name == "d2t" else t.to(lane.torch_dtype) for name, t in state.items()}
    if lane.has_d2t:
        targets = torch.arange(lane.draft_vocab_size, device=device) + state["d2t"]
        if int(targets.min()) < 0 or int(targets.max()) >= lane.target_vocab_size:
            where = next((str(p) for p, names in by_file.items() if "d2t" in names), "d2t")
            raise CheckpointError(f"{where}: d2t maps draft ids outside [0, "
                                  f"{lane.target_vocab_size}) (the vocab_size)")
    drafter.load_state_dict(state, assign=True)
    drafter.fill_tables()
    return drafter.eval()


def _check_keys(lane: LaneConfig, expected: dict[str, tuple[int, ...]],
                found: dict[str, tuple[int, ...]], ignored: frozenset[str]) -> None:
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected) - ignored)
    if missing or unexpected:
        raise CheckpointError(f"checkpoint keys do not match lane {lane.name!r}: "
                              f"missing {missing}, unexpected {unexpected}")
    for name, shape in expected.items():
        if found[name] != shape:
            raise CheckpointError(f"{name}: checkpoint has shape {list(found[name])}, lane "
                                  f"{lane.name!r} expects {list(shape)}")
