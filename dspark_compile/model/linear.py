"""``nn.Linear`` whose GEMMs of a few rows run the skinny GEMM kernel on lanes with
``skinny_gemm`` (``dspark_compile/kernels/linear/``): the block's projections. The context
append's stay ``nn.Linear``, see :meth:`Attention.keys_values`."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from dspark_compile.config import LaneConfig
from dspark_compile.kernels.linear import linear as skinny_linear


def skinny(lane: LaneConfig) -> bool:
    """Whether ``lane``'s projections take the skinny GEMM where it applies: as the lane's
    device decided it (:meth:`LaneConfig.for_device`)."""
    return lane.skinny_gemm is True


class Linear(nn.Linear):
    """``skinny``: GEMMs of a few rows through the skinny GEMM (see :func:`skinny`)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, skinny: bool = False):
        super().__init__(in_features, out_features, bias=bias)
        self.skinny = skinny

    def forward(self, x: Tensor) -> Tensor:
        if self.skinny:
            return skinny_linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)
