"""The reference: the draft step as plain PyTorch ops. The payload is the weights alone."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import torch
from torch import Tensor

from dspark_compile.draft import DraftStep

DEVICES = ("cpu", "cuda")
DTYPE: Optional[str] = None
NEEDS: tuple[str, ...] = ()
INSTALL = ""
LOADS_WITHOUT_WEIGHTS = False


def compile_bucket(step: DraftStep, bucket: int, example: tuple[Tensor, ...],
                   out_dir: Path) -> None:
    pass  # nothing beyond the weights, which every artifact carries


def finish(step: DraftStep, examples: dict[int, tuple[Tensor, ...]], out_dir: Path) -> None:
    pass


def prepare(out_dir: Path, device: torch.device) -> None:
    pass


def load(out_dir: Path, step: DraftStep, buckets: list[int]) -> dict[int, Callable]:
    return {bucket: step for bucket in buckets}
