"""The reference: the draft step as plain PyTorch ops. The payload is the weights alone."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from torch import Tensor

from dspark_compile.draft import DraftStep


def compile(step: DraftStep, examples: dict[int, tuple[Tensor, ...]], out_dir: Path) -> None:
    pass  # nothing beyond the weights, which every artifact carries


def load(out_dir: Path, step: DraftStep, buckets: list[int]) -> dict[int, Callable]:
    return {bucket: step for bucket in buckets}
