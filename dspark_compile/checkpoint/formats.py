"""Load and save a checkpoint in either format: config.json through the format's mapping
(deepspec.py, speculators.py), tensors by name (weights.py, verifier.py)."""

from __future__ import annotations

import json
import re
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors.torch import save_file

from dspark_compile.checkpoint import deepspec, speculators
from dspark_compile.checkpoint.verifier import (EMBED, LM_HEAD, describe, named_verifier,
                                                verifier_tensors)
from dspark_compile.checkpoint.weights import CHECKPOINT_WEIGHTS, load_weights, tensor_files
from dspark_compile.config import LaneConfig
from dspark_compile.errors import CheckpointError
from dspark_compile.model import Drafter

CONFIG = "config.json"
# tensors of speculators' own model that are not the drafter's
SPECULATORS_EXTRA = frozenset({"t2d", "verifier_lm_head.weight", "verifier_norm.weight"})


class Format(str, Enum):
    deepspec = "deepspec"
    speculators = "speculators"


def checkpoint_format(config: dict[str, Any]) -> Format:
    return Format.speculators if "speculators_model_type" in config else Format.deepspec


def read_lane(config: dict[str, Any], lane: LaneConfig, path: Path
              ) -> tuple[LaneConfig, dict[str, str]]:
    """``lane`` with every field the checkpoint's config.json sets, and each field's source."""
    reader = (speculators if checkpoint_format(config) is Format.speculators else deepspec).read
    try:
        reading = reader(config)
        # its artifacts are named after the checkpoint, whose geometry is not the lane's
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", path.resolve().parent.name) or "checkpoint"
        reading.put("name", name, "the checkpoint's directory")
        return reading.lane(lane)
    except CheckpointError as err:
        raise CheckpointError(f"{path}: {err}") from None
    except (TypeError, ValueError, AttributeError) as err:
        raise CheckpointError(f"{path}: {err}") from err


def verifier_names(lane: LaneConfig) -> list[str]:
    """The tensors a speculators drafter of ``lane`` takes from its verifier."""
    return [EMBED] if lane.has_d2t else [EMBED, LM_HEAD]


def load_checkpoint(directory: str | Path, lane: LaneConfig,
                    device: torch.device | str = "cpu",
                    verifier: Optional[str | Path] = None) -> Drafter:
    """Load either format onto ``device``. Every field of the checkpoint's config.json wins
    over the lane (``drafter.sources`` says where each lane field came from); every tensor
    is checked against the resulting shapes before any is loaded.

    ``verifier``: the target's directory, for the tensors a speculators checkpoint leaves
    to it (``embed_tokens``, and ``lm_head`` for a full-vocabulary draft); by default the
    directory its ``speculators_config`` names, where that is a local one.
    """
    directory = Path(directory)
    try:
        config = json.loads((directory / CONFIG).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{directory / CONFIG}: {err}") from err
    if not isinstance(config, dict):
        raise CheckpointError(f"{directory / CONFIG}: expected a JSON object")
    lane, sources = read_lane(config, lane, directory / CONFIG)
    files = tensor_files(directory)
    fmt = checkpoint_format(config)
    supplied = {}
    if fmt is Format.deepspec and verifier is not None:
        raise CheckpointError(f"{directory}: verifier: a DeepSpec checkpoint keeps every "
                              "tensor itself")
    if fmt is Format.speculators:
        names = verifier_names(lane)
        if verifier is None and any(name not in files for name in names):
            missing = [name for name in names if name not in files]
            try:
                verifier = named_verifier(config, directory)
            except CheckpointError as err:
                raise CheckpointError(f"{err} (it lacks {missing})") from None
        if verifier is not None:
            supplied = verifier_tensors(verifier, names)
    ignored = SPECULATORS_EXTRA if fmt is Format.speculators else frozenset()
    try:
        drafter = load_weights(lane, files, device, supplied, ignored)
    except CheckpointError as err:  # named by its checkpoint, once
        if str(directory) in str(err):
            raise
        raise CheckpointError(f"{directory}: {err}") from None
    drafter.sources = sources
    return drafter


def save_checkpoint(drafter: Drafter, directory: str | Path,
                    fmt: Format | str = Format.deepspec,
                    verifier: Optional[str | Path] = None) -> Path:
    """Write ``config.json`` and ``model.safetensors`` under ``directory``, as the format's
    own code writes them. In the speculators format, ``verifier`` (the target's directory)
    is named in ``speculators_config`` and the tensors it supplies are left out; without one
    they are kept in the file."""
    fmt, lane = Format(fmt), drafter.lane
    if fmt is Format.deepspec:
        if verifier is not None:
            raise CheckpointError("verifier: the DeepSpec format keeps every tensor itself")
        config = deepspec.write(lane)
    else:
        config = speculators.write(lane, None if verifier is None else describe(verifier))
    tensors = {name: t.detach().contiguous().cpu() for name, t in drafter.state_dict().items()}
    if verifier is not None:
        for name in verifier_names(lane):
            del tensors[name]
    if fmt is Format.speculators and lane.has_d2t:
        # t2d marks the target ids the draft vocabulary covers (training only; ignored on load)
        t2d = torch.zeros(lane.target_vocab_size, dtype=torch.bool)
        t2d[torch.arange(lane.draft_vocab_size) + tensors["d2t"]] = True
        tensors["t2d"] = t2d
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, str(directory / CHECKPOINT_WEIGHTS), metadata={"format": "pt"})
    return directory
