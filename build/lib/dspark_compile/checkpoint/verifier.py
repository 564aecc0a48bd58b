"""Tensors a speculators checkpoint leaves to its verifier (the target model), read by name
from the target's own safetensors files without loading the target.

Names resolve as the speculators package resolves them: the exact name, else the shortest
key ending in it (``model.embed_tokens.weight``); a target without ``lm_head.weight``
ties it to its embeddings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from safetensors import SafetensorError, safe_open
from torch import Tensor

from dspark_compile.checkpoint.weights import tensor_files
from dspark_compile.errors import CheckpointError

EMBED, LM_HEAD = "embed_tokens.weight", "lm_head.weight"


def verifier_tensors(directory: str | Path, names: list[str]) -> dict[str, Tensor]:
    """``names`` (of :data:`EMBED`, :data:`LM_HEAD`) from the target under ``directory``."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"verifier {directory}: not a directory")
    files = tensor_files(directory)
    keys = {name: _resolve(name, files) for name in set(names) | {EMBED}}
    if keys[EMBED] is None:
        raise CheckpointError(f"verifier {directory}: no tensor named {EMBED!r} (or ending "
                              "in it)")
    keys[LM_HEAD] = keys.get(LM_HEAD) or keys[EMBED]  # tied embeddings
    out = {}
    for name in names:
        path = files[keys[name]]
        try:
            with safe_open(str(path), framework="pt") as f:
                out[name] = f.get_tensor(keys[name])
        except (OSError, RuntimeError, ValueError, SafetensorError) as err:
            raise CheckpointError(f"verifier {path}: {err}") from err
    return out


def _resolve(name: str, files: dict[str, Path]) -> Optional[str]:
    if name in files:
        return name
    matches = [key for key in files if key.endswith("." + name)]
    return min(matches, key=len) if matches else None


def describe(directory: str | Path) -> dict[str, Any]:
    """The verifier entry a speculators config.json names: its path and architectures."""
    try:
        config = json.loads((Path(directory) / "config.json").read_text())
        architectures = list(config.get("architectures") or [])
    except (OSError, ValueError, AttributeError, TypeError):
        architectures = []
    return {"name_or_path": str(directory), "architectures": architectures}
