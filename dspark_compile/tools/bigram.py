"""A bigram model as the speculative loop's target: a token's next-token logits and its
features are rows of two seeded random tables, whatever came before it. Its pass is two
lookups, so a loop driving it spends nearly all its time on its own work (the draft, the
verification, the host), and its greedy text is a walk anyone can recompute."""

from __future__ import annotations

import torch
from torch import Tensor

from dspark_compile.runtime.transfer import upload


class BigramTarget:
    """``rows`` rows of a bigram model (the loop's ``Target``): a pass looks its tokens up."""

    def __init__(self, vocab: int, feature_size: int, rows: int, device: torch.device):
        generator = torch.Generator(device).manual_seed(11)  # made there: V x V is large
        self.logits = torch.randn(vocab, vocab, generator=generator, device=device)
        self.features = torch.randn(vocab, feature_size, generator=generator, device=device)
        self.rows, self.device = rows, device

    def prefill(self, rows: list[int], prompts: list[list[int]]) -> tuple[Tensor, Tensor]:
        tokens = torch.zeros(len(prompts), max(map(len, prompts)), dtype=torch.long)
        for i, prompt in enumerate(prompts):
            tokens[i, :len(prompt)] = torch.tensor(prompt)
        last = upload([prompt[-1] for prompt in prompts], self.device)
        return self.logits[last], self.features[upload(tokens, self.device)]

    def verify(self, tokens: Tensor, start: Tensor) -> tuple[Tensor, Tensor]:
        return self.logits[tokens], self.features[tokens]

    def greedy(self, prompt: list[int], new_tokens: int) -> list[int]:
        out, token = [], prompt[-1]
        for _ in range(new_tokens):
            token = int(self.logits[token].argmax())
            out.append(token)
        return out
