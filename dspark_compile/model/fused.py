"""One Linear over the row-concatenation of several that read the same input (Q|K|V,
gate|up): one GEMM reads all their weights, where a decode round's few rows make each GEMM
a weight-bound launch of its own. State dicts still hold the parts under their own names,
so checkpoints and artifacts keep their formats."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from dspark_compile.model.linear import Linear


class FusedLinear(Linear):
    """``parts`` (name -> output features, in row order) as one weight. The module that
    holds it calls :func:`keep_part_names` so that its state dicts name the parts."""

    def __init__(self, in_features: int, parts: dict[str, int], bias: bool,
                 skinny: bool = False):
        super().__init__(in_features, sum(parts.values()), bias, skinny)
        self.parts = dict(parts)

    def rows(self, first: str) -> tuple[Tensor, Optional[Tensor]]:
        """Weight and bias rows of the parts from ``first`` on (a view, no copy)."""
        start = 0
        for part, size in self.parts.items():
            if part == first:
                return self.weight[start:], None if self.bias is None else self.bias[start:]
            start += size
        raise KeyError(first)


def keep_part_names(owner: nn.Module) -> None:
    """``owner``'s state dicts hold each :class:`FusedLinear` child as its parts (hooks on
    the owner: a child's load hook sees only its own prefix's keys)."""
    owner.register_state_dict_post_hook(_split)
    owner.register_load_state_dict_pre_hook(_join)


def _fused(owner: nn.Module, prefix: str):
    for attribute, module in owner.named_children():
        if isinstance(module, FusedLinear):
            for field in ("weight", "bias"):
                names = [f"{prefix}{part}.{field}" for part in module.parts]
                yield module, f"{prefix}{attribute}.{field}", names


def _split(owner: nn.Module, state_dict: dict, prefix: str, local_metadata: dict) -> None:
    for module, fused, names in _fused(owner, prefix):
        if fused in state_dict:
            pieces = state_dict.pop(fused).split(list(module.parts.values()))
            # clones: tensors sharing one storage cannot go into a safetensors file together
            state_dict.update({name: piece.clone() for name, piece in zip(names, pieces)})


def _join(owner: nn.Module, state_dict: dict, prefix: str, *args) -> None:
    for _, fused, names in _fused(owner, prefix):
        if all(name in state_dict for name in names):
            state_dict[fused] = torch.cat([state_dict.pop(name) for name in names])


def state_sources(model: nn.Module) -> dict[str, list[str]]:
    """Each parameter and persistent buffer of ``model`` by the state-dict entries it is
    made of, in row order: its own name, or a fused projection's parts (for a loader that
    reads the state dict's file without this module, the C++ runtime's)."""
    sources = {}
    for prefix, module in model.named_modules():
        dot = f"{prefix}." if prefix else ""
        owner = dot[: dot[:-1].rfind(".") + 1]
        tensors = [*module.named_parameters(recurse=False),
                   *((name, buffer) for name, buffer in module.named_buffers(recurse=False)
                     if name not in module._non_persistent_buffers_set)]
        for field, _ in tensors:
            sources[dot + field] = ([f"{owner}{part}.{field}" for part in module.parts]
                                    if isinstance(module, FusedLinear) else [dot + field])
    return sources
