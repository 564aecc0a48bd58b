"""The target's forward over a static KV cache, for timing: transformers' own Llama modules
(norms, rotary embedding, the MLP's activation) and weights (the bias-free projections),
with the attention over a fixed cache ``[layers, B, kv_heads, slots, head_dim]`` written at
per-row positions. Shapes are fixed for a given (batch, new tokens), so a pass can be
captured as one CUDA graph; plain generation and speculative verification use this one
implementation."""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from dspark_compile.runtime.transfer import upload


class StaticLlama:
    def __init__(self, model: torch.nn.Module, batch: int, slots: int, taps: list[int]):
        config = model.config
        if config.attention_bias or config.mlp_bias:
            raise ValueError("the projections are applied as F.linear without a bias")
        self.model, self.taps, self.slots = model, taps, slots
        self.kv_heads, self.head_dim = config.num_key_value_heads, config.head_dim
        shape = (config.num_hidden_layers, batch, self.kv_heads, slots, self.head_dim)
        device, dtype = model.device, model.dtype
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)

    def prefill(self, prompts: list[list[int]], rows: Optional[list[int]] = None
                ) -> tuple[Tensor, Tensor, Tensor]:
        """The prompts, right-padded, from position 0 into ``rows`` (default: rows 0 ..
        len(prompts) - 1, which must then be all of them): each prompt's last logits, its
        features, and the prompts' lengths."""
        device = self.k.device
        tokens = torch.zeros(len(prompts), max(map(len, prompts)), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            tokens[row, :len(prompt)] = torch.tensor(prompt)
        # queued, not waited for: a refill's prompts go in while a pass still runs
        lengths = upload([len(p) for p in prompts], device)
        logits, features = self.forward(upload(tokens, device), torch.zeros_like(lengths),
                                        None if rows is None else upload(rows, device))
        return logits[torch.arange(len(prompts), device=device), lengths - 1], features, lengths

    @torch.no_grad()
    def forward(self, tokens: Tensor, start: Tensor, rows: Optional[Tensor] = None
                ) -> tuple[Tensor, Tensor]:
        """Feed ``tokens [B, n]`` at positions ``start[b] + i`` into the cache's ``rows``
        (default: every row, in order); returns fp32 logits ``[B, n, V]`` and the drafter's
        features ``[B, n, taps x hidden]``. Each row sees its cache below its own positions:
        what a longer earlier pass left beyond them is masked, then overwritten."""
        inner = self.model.model
        B, n = tokens.shape
        positions = start[:, None] + torch.arange(n, device=tokens.device)
        x = inner.embed_tokens(tokens)
        cos, sin = inner.rotary_emb(x, position_ids=positions)
        keys = torch.arange(self.slots, device=tokens.device)
        # each kv head's query heads folded into its rows (q head h reads kv head h // group,
        # as enable_gqa would): SDPA then picks a fused kernel for fp32, where enable_gqa
        # falls back to the math path, which copies the cache group-fold per layer
        group = inner.config.num_attention_heads // self.kv_heads
        visible = (keys[None, None, :] <= positions[:, :, None])[:, None]  # [B, 1, n, slots]
        visible = visible.expand(B, group, n, self.slots).reshape(B, 1, group * n, self.slots)
        every = rows is None  # then the whole cache is read as it is, no copy of its rows
        rows = torch.arange(B, device=tokens.device) if every else rows
        batch = rows[:, None].expand(B, n)
        features = []
        for i, layer in enumerate(inner.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = F.linear(h, attn.q_proj.weight).view(B, n, -1, self.head_dim).transpose(1, 2)
            k = F.linear(h, attn.k_proj.weight).view(B, n, -1, self.head_dim).transpose(1, 2)
            v = F.linear(h, attn.v_proj.weight).view(B, n, -1, self.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            self.k[i][batch, :, positions] = k.transpose(1, 2)
            self.v[i][batch, :, positions] = v.transpose(1, 2)
            cached_k, cached_v = self.k[i], self.v[i]
            if not every:
                cached_k, cached_v = cached_k[rows], cached_v[rows]
            out = F.scaled_dot_product_attention(
                q.reshape(B, self.kv_heads, group * n, self.head_dim), cached_k, cached_v,
                attn_mask=visible, scale=attn.scaling).reshape(B, -1, n, self.head_dim)
            x = x + F.linear(out.transpose(1, 2).reshape(B, n, -1), attn.o_proj.weight)
            h, mlp = layer.post_attention_layernorm(x), layer.mlp
            up = mlp.act_fn(F.linear(h, mlp.gate_proj.weight)) * F.linear(h, mlp.up_proj.weight)
            x = x + F.linear(up, mlp.down_proj.weight)
            if i in self.taps:
                features.append(x)
        logits = F.linear(inner.norm(x), self.model.lm_head.weight).float()
        order = sorted(self.taps)
        return logits, torch.cat([features[order.index(t)] for t in self.taps], -1)


def captured(llama: StaticLlama, batch: int, n: int
             ) -> Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """``llama.forward`` for ``[batch, n]`` tokens as one CUDA graph: copies the inputs into
    its buffers, replays, and returns its output buffers (valid until the next call)."""
    device = llama.k.device
    tokens = torch.zeros(batch, n, dtype=torch.long, device=device)
    start = torch.zeros(batch, dtype=torch.long, device=device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            llama.forward(tokens, start)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = llama.forward(tokens, start)

    def run(new_tokens: Tensor, new_start: Tensor) -> tuple[Tensor, Tensor]:
        tokens.copy_(new_tokens)
        start.copy_(new_start)
        graph.replay()
        return outputs
    return run


class LlamaTarget:
    """A :class:`StaticLlama` of ``rows`` rows as the speculative loop's target
    (``dspark_compile.speculative.Target``): prompts through the rows they fill, and
    verification passes of up to ``n`` tokens over every row, each width captured as one
    CUDA graph where ``graphs`` (all before the first pass: none is captured in a timed
    run). ``pad``: the width each pass of fewer tokens runs as, where a wider pass is
    faster (GEMM libraries pick worse kernels at some widths); the tokens past a pass's own
    are zeros whose outputs are dropped and whose keys later passes mask, then overwrite."""

    def __init__(self, model: torch.nn.Module, rows: int, slots: int, taps: list[int],
                 n: int, graphs: bool, pad: Optional[dict[int, int]] = None):
        self.llama, self.rows, self.pad = StaticLlama(model, rows, slots, taps), rows, pad or {}
        self.passes = {width: captured(self.llama, rows, width) for width in range(1, n + 1)
                       } if graphs else None

    def verify(self, tokens: Tensor, start: Tensor) -> tuple[Tensor, Tensor]:
        n = tokens.shape[1]
        if self.pad.get(n, n) > n:
            tokens = F.pad(tokens, (0, self.pad[n] - n))
        run = self.llama.forward if self.passes is None else self.passes[tokens.shape[1]]
        logits, features = run(tokens, start)
        return logits[:, :n], features[:, :n]

    def prefill(self, rows: list[int], prompts: list[list[int]]) -> tuple[Tensor, Tensor]:
        return self.llama.prefill(prompts, rows)[:2]
