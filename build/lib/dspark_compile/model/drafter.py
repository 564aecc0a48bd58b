"""The whole drafter: backbone plus heads. Its state_dict keys are DeepSpec's, unprefixed."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from dspark_compile.config import LaneConfig
from dspark_compile.model.backbone import Backbone
from dspark_compile.model.heads import ConfidenceHead, MarkovHead


class Drafter(Backbone):
    def __init__(self, lane: LaneConfig):
        super().__init__(lane)
        self.markov_head = MarkovHead(lane)
        self.confidence_head = ConfidenceHead(lane)
        # lane field -> where its value came from, for a drafter read from a checkpoint
        self.sources: dict[str, str] = {}
        self.d2t: Optional[Tensor]
        if lane.has_d2t:
            self.register_buffer("d2t", torch.zeros(lane.draft_vocab_size, dtype=torch.long))
        else:
            self.d2t = None

    def confidences(self, h: Tensor, prevs: Tensor) -> Tensor:
        """Confidences ``[R, k]`` of the rows ``h`` given the ids fed to each step."""
        return self.confidence_head(h, self.markov_head.markov_w1(prevs))
