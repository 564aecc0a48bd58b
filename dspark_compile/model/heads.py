"""The sequential heads: the Markov head (vanilla, gated, rnn) and the confidence head."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dspark_compile.config import LaneConfig, MarkovHead as Kind
from dspark_compile.model.vocab import TokenTable


def row_norms(w: Tensor) -> Tensor:
    """``||w[v]||`` of every row in fp32, rounded up (the certified walk's bounds)."""
    exact = w.double().norm(dim=-1)
    return torch.nextafter(exact.float(), torch.tensor(float("inf"), device=w.device))


class MarkovHead(nn.Module):
    """``bias_k = W2 · latent_k`` where the latent starts from ``W1[prev]`` (DeepSpec heads).

    W1 is indexed by target ids (``[V_target, r]``); W2 maps to the draft vocabulary.
    """

    def __init__(self, lane: LaneConfig):
        super().__init__()
        self.kind = lane.markov_head
        r, hidden = lane.markov_rank, lane.hidden_size
        self.markov_w1 = TokenTable(lane.target_vocab_size, r)
        self.markov_w2 = nn.Linear(r, lane.draft_vocab_size, bias=False)
        if lane.certified_markov_walk:  # W2's row norms: fill_norms() once W2 is set
            self.register_buffer("w2_norms", torch.zeros(lane.draft_vocab_size),
                                 persistent=False)
        if self.kind is Kind.gated:
            self.gate_proj = nn.Linear(hidden + r, r)
        elif self.kind is Kind.rnn:
            self.joint_proj = nn.Linear(2 * r + hidden, 3 * r)

    def fill_norms(self) -> None:
        """(Re)compute ``w2_norms`` from W2, where the lane has them: call after W2's
        storage is filled or changed."""
        if hasattr(self, "w2_norms"):
            self.w2_norms = row_norms(self.markov_w2.weight)

    def initial_state(self, anchor: Tensor, anchor_row: Optional[Tensor], like: Tensor
                      ) -> Optional[Tensor]:
        """The recurrent state before the first drafted step (rnn only): zeros ``[R, r]``,
        or, in the 1+k layout, the state the anchor's own row ``anchor_row [R, H]`` leaves
        (speculators' ``block_bias`` runs the recurrence over every block slot, the
        anchor's included, with the anchor as that slot's previous token)."""
        if self.kind is not Kind.rnn:
            return None
        state = like.new_zeros(like.shape[0], self.markov_w1.embedding_dim)
        if anchor_row is not None:
            state, _ = self._recur(state, self.markov_w1(anchor), anchor_row)
        return state

    def _recur(self, state: Tensor, e: Tensor, h_k: Tensor) -> tuple[Tensor, Tensor]:
        """The rnn head's next state and latent."""
        gate, candidate, out = self.joint_proj(torch.cat([state, e, h_k], dim=-1)).chunk(3, -1)
        gate = torch.sigmoid(gate)
        return gate * state + (1.0 - gate) * torch.tanh(candidate), torch.tanh(out)

    def step_bias(self, prev: Tensor, h_k: Tensor, state: Optional[Tensor]
                  ) -> tuple[Tensor, Optional[Tensor]]:
        """Bias ``[R, V_draft]`` (model dtype) for one step, and the next recurrent state."""
        e = self.markov_w1(prev)
        if self.kind is Kind.vanilla:
            latent = e
        elif self.kind is Kind.gated:
            latent = torch.sigmoid(self.gate_proj(torch.cat([h_k, e], dim=-1))) * e
        else:
            state, latent = self._recur(state, e, h_k)
        return self.markov_w2(latent), state


class ConfidenceHead(nn.Module):
    """``c_k = sigmoid((w · [h_k ; W1[prev_k]] + b) / T_k)``, returned in fp32; ``T_k`` the
    lane's ``confidence_temperatures`` (STS), else 1.

    Accumulated in fp64 and rounded once: the fp32 result is then the same whatever order
    a backend sums the dot product in, so confidences stay bit-identical across compilers.
    """

    def __init__(self, lane: LaneConfig):
        super().__init__()
        width = lane.hidden_size + (lane.markov_rank if lane.confidence_with_markov else 0)
        self.with_markov = lane.confidence_with_markov
        self.temperatures = lane.confidence_temperatures
        self.proj = nn.Linear(width, 1)

    def forward(self, h: Tensor, prev_embeddings: Optional[Tensor]) -> Tensor:
        """``h [R, k, H]``, ``prev_embeddings [R, k, r]`` (None for a lane with no Markov
        head) -> confidences ``[R, k]`` (fp32)."""
        x = torch.cat([h, prev_embeddings], dim=-1) if self.with_markov else h
        logit = F.linear(x.double(), self.proj.weight.double(), self.proj.bias.double())
        logit = logit.squeeze(-1)
        if self.temperatures is not None:  # Python floats: no tensor to upload, even in capture
            logit = torch.stack([logit[..., j] / t for j, t in enumerate(self.temperatures)], -1)
        return torch.sigmoid(logit).float()
