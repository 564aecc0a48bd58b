"""Tensors a speculators checkpoint leaves to its verifier (the target model), read by name
from the target's own safetensors files without loading the target.

Names resolve as the speculators package resolves them: for the name and then each of its
aliases (``tok_embeddings.weight``, ``output.weight``, ...), the exact key, else the
shortest key ending in it (``model.embed_tokens.weight``); a target without an lm_head
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
# the names other checkpoints give these tensors (speculators' own alias table)
ALIASES = {EMBED: ["tok_embeddings.weight", "llm.embed.weight", "backbone.embeddings.weight"],
           LM_HEAD: ["output.weight", "llm.unembed.weight"]}


def verifier_tensors(directory: str | Path, names: list[str]) -> dict[str, Tensor]:
    """``names`` (of :data:`EMBED`, :data:`LM_HEAD`) from the target under ``directory``."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"verifier {directory}: not a directory")
    files = tensor_files(directory)
    keys = {name: _resolve(name, files) for name in set(names) | {EMBED}}
    if keys[EMBED] is None:
        raise CheckpointError(f"verifier {directory}: no tensor named {EMBED!r} or one of "
                              f"{ALIASES[EMBED]} (or ending in one)")
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
    for candidate in [name, *ALIASES.get(name, [])]:
        if candidate in files:
            return candidate
        matches = [key for key in files if key.endswith(candidate)]
        if matches:
            return min(matches, key=len)
    return None


def named_verifier(config: dict[str, Any], checkpoint: Path) -> Path:
    """The verifier directory a speculators config.json names
    (``speculators_config.verifier.name_or_path``), if it is a local directory; else a
    :class:`CheckpointError` that asks for ``verifier=`` (nothing is downloaded)."""
    section = config.get("speculators_config")
    verifier = section.get("verifier") if isinstance(section, dict) else None
    name = verifier.get("name_or_path") if isinstance(verifier, dict) else None
    if isinstance(name, str) and Path(name).is_dir():
        return Path(name)
    where = (f"names {name!r}, which is not a local directory (nothing is downloaded)"
             if name else "names no verifier")
    raise CheckpointError(
        f"{checkpoint}: the tensors a speculators checkpoint leaves to its verifier are not "
        f"in it, and its speculators_config.verifier {where}; pass the target's directory "
        "(load_checkpoint(..., verifier=DIR), or verifier=DIR on the command line)")


def describe(directory: str | Path) -> dict[str, Any]:
    """The verifier entry a speculators config.json names: its path and architectures."""
    try:
        config = json.loads((Path(directory) / "config.json").read_text())
        architectures = list(config.get("architectures") or [])
    except (OSError, ValueError, AttributeError, TypeError):
        architectures = []
    return {"name_or_path": str(directory), "architectures": architectures}
