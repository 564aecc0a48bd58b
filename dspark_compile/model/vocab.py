"""Tables indexed by token id, and the draft vocabulary -> target vocabulary map
``t = d + d2t[d]`` (speculators' int64 offsets)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn


class TokenTable(nn.Embedding):
    """``nn.Embedding`` without its random init: every drafter's weights are loaded or drawn
    after it is built on the meta device, where ``normal_`` would import ``torch._dynamo``
    (over a second of a cold start)."""

    def reset_parameters(self) -> None:
        pass


def to_target(draft_ids: Tensor, d2t: Optional[Tensor]) -> Tensor:
    """Target ids of draft ids; the identity when the lane has no reduced vocabulary."""
    return draft_ids if d2t is None else draft_ids + d2t[draft_ids]


def random_d2t(draft_vocab: int, target_vocab: int, generator: torch.Generator,
               device: torch.device) -> Tensor:
    """Offsets for a seeded, sorted random subset of the target vocabulary."""
    perm = torch.randperm(target_vocab, generator=generator, device=device)
    chosen, _ = perm[:draft_vocab].sort()
    return chosen - torch.arange(draft_vocab, device=device)
