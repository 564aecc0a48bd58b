"""The whole drafter: backbone plus heads. Its state_dict keys are DeepSpec's, unprefixed."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from dspark_compile.config import LaneConfig, Layout
from dspark_compile.model.backbone import Backbone
from dspark_compile.model.heads import ConfidenceHead, MarkovHead


class Drafter(Backbone):
    """A lane with ``markov_rank`` 0 has no Markov head (its ids are the base argmax), and
    one with ``confidence_head`` false no confidence head, as both formats' code builds
    them."""

    def __init__(self, lane: LaneConfig):
        super().__init__(lane)
        self.markov_head = MarkovHead(lane) if lane.markov_rank else None
        self.confidence_head = ConfidenceHead(lane) if lane.confidence_head else None
        # lane field -> where its value came from, for a drafter read from a checkpoint
        self.sources: dict[str, str] = {}
        self.d2t: Optional[Tensor]
        if lane.has_d2t:
            self.register_buffer("d2t", torch.zeros(lane.draft_vocab_size, dtype=torch.long))
        else:
            self.d2t = None

    def fill_tables(self) -> None:
        """(Re)compute what the weights determine (the RoPE tables, W2's row norms): call
        after the storage is materialised or the weights change."""
        self.fill_rope_tables()
        if self.markov_head is not None:
            self.markov_head.fill_norms()

    def block(self, k_cache: Tensor, v_cache: Tensor, anchor: Tensor, anchor_pos: Tensor,
              features: Optional[Tensor] = None, num_new: Optional[Tensor] = None
              ) -> tuple[Tensor, Tensor, Optional[Tensor]]:
        """The drafted rows' hidden ``h [R, k, H]``, base logits ``[R, k, V_draft]`` and
        the Markov head's state before the first drafted step (:meth:`Backbone.forward`)."""
        rows = self.hidden_rows(k_cache, v_cache, anchor, anchor_pos, features, num_new)
        h = self.drafted(rows)
        state = None
        if self.markov_head is not None:
            anchor_row = rows[:, 0] if self.lane.layout is Layout.one_plus_k else None
            state = self.markov_head.initial_state(anchor, anchor_row, h)
        return h, self.lm_head(h), state

    def calibrate(self, temperatures: Optional[Sequence[float]]) -> None:
        """STS: the confidence head's temperature per draft position from now on (None: its
        own confidences). The lane says so too, so an artifact built from this drafter is
        keyed by them and applies them in its step."""
        self.lane = self.lane.replace(
            confidence_temperatures=None if temperatures is None else list(temperatures))
        self.confidence_head.temperatures = self.lane.confidence_temperatures

    def confidences(self, h: Tensor, prevs: Tensor) -> Tensor:
        """Confidences ``[R, k]`` (fp32) of the rows ``h`` given the ids fed to each step;
        NaN where the drafter has no confidence head (a runner reports none)."""
        if self.confidence_head is None:
            return h.new_full(h.shape[:2], float("nan"), dtype=torch.float32)
        markov = None if self.markov_head is None else self.markov_head.markov_w1(prevs)
        return self.confidence_head(h, markov)
