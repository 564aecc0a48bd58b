"""The parallel backbone: Qwen3 layers whose keys and values also see the target's features.

Context K/V live in static per-request buffers ``[R, layers, kv_heads, slots, head_dim]``
where slot = position. Behind the context sit ``block_rows`` scratch slots for the block's
own K/V (the next append overwrites them; they are never read as context) and one trash
slot that swallows padding rows. Every shape is static; per-request lengths are tensors.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dspark_compile.config import LaneConfig, Layout
from dspark_compile.kernels.attention import block_attention
from dspark_compile.kernels.linear import MAX_ROWS
from dspark_compile.model.fused import FusedLinear, keep_part_names
from dspark_compile.model.linear import Linear, skinny
from dspark_compile.model.masks import Mask, Span, attention_masks
from dspark_compile.model.rope import rope_tables
from dspark_compile.model.vocab import TokenTable

# transformers' ACT2FN names (config.ACTIVATIONS)
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_new": lambda x: 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi)
                                                      * (x + 0.044715 * torch.pow(x, 3.0)))),
    "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x: Tensor) -> Tensor:
        # Qwen3 normalises in fp32, rounds, then scales in the model dtype. We normalise in
        # fp64: the rounded result is then the same whatever order a compiler sums the
        # squares in (an fp32 sum in another order flips bf16 roundings, seen on CUDA).
        wide = x.to(torch.float64)
        wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * wide.to(x.dtype)


# A round's context rows share each layer's Q|K|V GEMM with the block's rows where the
# block has more rows than the skinny GEMM takes and at most FOLD_ROWS: one launch then
# reads the weight, which the few rows make the GEMM's cost. At batch 1 (the skinny GEMM's
# rows) it gains nothing, and at 64 requests the separate GEMMs are faster.
FOLD_ROWS = 128


@dataclass(frozen=True)
class ContextRows:
    """A round's new context rows ``hidden [R, N, H]`` (fc and hidden_norm of the target's
    features), their RoPE tables and the cache slots their K/V go to."""

    hidden: Tensor
    cos: Tensor
    sin: Tensor
    slots: Tensor


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x [R, n, heads, head_dim]``."""
    cos, sin = cos[:, :, None], sin[:, :, None]
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, lane: LaneConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            lane.num_heads, lane.num_kv_heads, lane.head_dim)
        q, kv = lane.num_heads * lane.head_dim, lane.num_kv_heads * lane.head_dim
        bias = lane.attention_bias
        self.sizes = (q, kv, kv)
        self.qkv_proj = FusedLinear(lane.hidden_size, {"q_proj": q, "k_proj": kv, "v_proj": kv},
                                    bias, skinny(lane))
        self.o_proj = Linear(q, lane.hidden_size, bias, skinny(lane))
        self.q_norm = RMSNorm(lane.head_dim, lane.rms_norm_eps)
        self.k_norm = RMSNorm(lane.head_dim, lane.rms_norm_eps)
        keep_part_names(self)

    def keys_values(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """K (normed, rotated) and V ``[R, n, kv_heads, head_dim]`` of rows ``x [R, n, H]``:
        one GEMM over the K|V rows of the weight. The context append's GEMMs stay off the
        skinny GEMM: a prefill has a prompt's rows, which ``aoti`` exports as a dynamic
        size, and the choice of kernel by row count must not depend on it."""
        k, v = F.linear(x, *self.qkv_proj.rows("k_proj")).split(self.sizes[1:], dim=-1)
        return self._rotated(k, v, cos, sin)

    def _rotated(self, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        shape = (*k.shape[:2], self.num_kv_heads, self.head_dim)
        return apply_rope(self.k_norm(k.view(shape)), cos, sin), v.view(shape)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor,
                layer: int, block_slots: Tensor, mask: Mask,
                context: Optional[ContextRows] = None) -> Tensor:
        """Attend the block rows ``x [R, n, H]`` over this layer's cache rows.

        The block's own K/V go to its scratch slots first, so one masked attention covers
        context and block; so do ``context``'s, to their slots, from the same GEMM.
        ``mask`` (:func:`masks.attention_masks`) is shared by the layers of one type.
        """
        R, n, _ = x.shape
        slots = block_slots
        if context is not None:
            x = torch.cat([context.hidden, x], dim=1)
            cos, sin = torch.cat([context.cos, cos], dim=1), torch.cat([context.sin, sin], dim=1)
            slots = torch.cat([context.slots, block_slots], dim=1)
        q, k, v = self.qkv_proj(x).split(self.sizes, dim=-1)
        k, v = self._rotated(k, v, cos, sin)
        write_rows(k_cache, layer, slots, k)
        write_rows(v_cache, layer, slots, v)
        q, cos, sin = q[:, -n:], cos[:, -n:], sin[:, -n:]
        q = self.q_norm(q.reshape(R, n, self.num_heads, self.head_dim))
        q = apply_rope(q, cos, sin)
        k, v, scale = k_cache[:, layer], v_cache[:, layer], self.head_dim ** -0.5
        if isinstance(mask, Span):
            out = block_attention(q, k, v, mask.anchor_pos, mask.window, mask.causal, scale)
        else:
            out = grouped_sdpa(q, k, v, mask, scale)
        return self.o_proj(out.reshape(R, n, self.num_heads * self.head_dim))


def grouped_sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float) -> Tensor:
    """SDPA of the block rows ``q [R, n, heads, D]`` over ``k, v [R, kv_heads, slots, D]``
    with a ``[R, 1, group*n, slots]`` mask (:func:`masks.attention_masks`); ``[R, n, heads,
    D]``. GQA without copying K/V: the ``group`` query heads of one kv head become extra
    rows."""
    R, n, heads, D = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    rows = q.view(R, n, kv_heads, group, D).permute(0, 2, 3, 1, 4).reshape(R, kv_heads, -1, D)
    out = F.scaled_dot_product_attention(rows, k, v, attn_mask=mask, scale=scale)
    return out.view(R, kv_heads, group, n, D).permute(0, 3, 1, 2, 4).reshape(R, n, heads, D)


def write_rows(cache: Tensor, layer: int, slots: Tensor, rows: Tensor) -> None:
    """``cache[r, layer, :, slots[r, i]] = rows[r, i]`` for a cache ``[R, layers, kv_heads,
    slots, D]``.

    One ``index_put_`` on the whole cache, never on a view of it: a compiler then writes
    the rows in place, where a write through a view made Inductor copy the whole cache.
    """
    batch = torch.arange(cache.shape[0], device=cache.device)[:, None].expand_as(slots)
    cache[batch, torch.full_like(slots, layer), :, slots] = rows


class MLP(nn.Module):
    def __init__(self, lane: LaneConfig):
        super().__init__()
        size = lane.intermediate_size
        self.gate_up_proj = FusedLinear(lane.hidden_size, {"gate_proj": size, "up_proj": size},
                                        False, skinny(lane))
        self.down_proj = Linear(lane.intermediate_size, lane.hidden_size, False, skinny(lane))
        self.act = ACTIVATIONS[lane.hidden_act]
        keep_part_names(self)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(self.act(gate) * up)


class Layer(nn.Module):
    def __init__(self, lane: LaneConfig):
        super().__init__()
        self.self_attn = Attention(lane)
        self.mlp = MLP(lane)
        self.input_layernorm = RMSNorm(lane.hidden_size, lane.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(lane.hidden_size, lane.rms_norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor,
                layer: int, block_slots: Tensor, mask: Mask,
                context: Optional[ContextRows] = None) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, k_cache, v_cache, layer,
                               block_slots, mask, context)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """Context append plus one parallel forward of the draft block."""

    def __init__(self, lane: LaneConfig):
        super().__init__()
        self.lane = lane
        self.embed_tokens = TokenTable(lane.target_vocab_size, lane.hidden_size)
        self.fc = nn.Linear(lane.feature_size, lane.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(lane.hidden_size, lane.rms_norm_eps)
        self.layers = nn.ModuleList(Layer(lane) for _ in range(lane.num_layers))
        self.norm = RMSNorm(lane.hidden_size, lane.rms_norm_eps)
        self.lm_head = Linear(lane.hidden_size, lane.draft_vocab_size, False, skinny(lane))
        # every position a cache slot can hold; derived from the lane, so not in checkpoints
        positions = lane.max_context + lane.block_rows + 1
        self.register_buffer("rope_cos", torch.empty(positions, lane.head_dim), persistent=False)
        self.register_buffer("rope_sin", torch.empty(positions, lane.head_dim), persistent=False)

    def fill_rope_tables(self) -> None:
        """(Re)compute the RoPE tables on the weights' device and dtype: call after the
        storage is materialised (``to_empty``, ``load_state_dict(assign=True)``)."""
        lane, weight = self.lane, self.fc.weight
        cos, sin = rope_tables(self.rope_cos.shape[0], lane.head_dim, lane.rope_theta,
                               lane.rope_scaling)
        self.rope_cos = cos.to(weight.device, weight.dtype)
        self.rope_sin = sin.to(weight.device, weight.dtype)

    def rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin ``[R, n, head_dim]`` of integer positions ``[R, n]``."""
        return self.rope_cos[positions], self.rope_sin[positions]

    def context_rows(self, slots: int, features: Tensor, num_new: Tensor, anchor_pos: Tensor
                     ) -> ContextRows:
        """The rows of ``features [R, N, F]`` for positions s-n .. s-1 of caches of
        ``slots`` slots.

        Row i of request r is valid when i < num_new[r]; other rows go to the trash slot
        and are zeroed first, so garbage in padding can never reach a real key.
        """
        N = features.shape[1]
        rows = torch.arange(N, device=features.device)
        valid = rows[None, :] < num_new[:, None]
        positions = anchor_pos[:, None] - num_new[:, None] + rows[None, :]
        features = torch.where(valid[..., None], features, 0)
        cos, sin = self.rope(torch.where(valid, positions, 0))  # padding rows: any position
        return ContextRows(self.hidden_norm(self.fc(features)), cos, sin,
                           torch.where(valid, positions, slots - 1))

    def append_context(self, k_cache: Tensor, v_cache: Tensor, features: Tensor,
                       num_new: Tensor, anchor_pos: Tensor) -> None:
        """Write K/V of the valid rows of ``features [R, N, F]`` at positions s-n .. s-1
        (:meth:`context_rows`)."""
        ctx = self.context_rows(k_cache.shape[3], features, num_new, anchor_pos)
        for i, layer in enumerate(self.layers):
            k, v = layer.self_attn.keys_values(ctx.hidden, ctx.cos, ctx.sin)
            write_rows(k_cache, i, ctx.slots, k)
            write_rows(v_cache, i, ctx.slots, v)

    def hidden_rows(self, k_cache: Tensor, v_cache: Tensor, anchor: Tensor, anchor_pos: Tensor,
                    features: Optional[Tensor] = None, num_new: Optional[Tensor] = None
                    ) -> Tensor:
        """The normed hidden rows ``[R, block_rows, H]`` of the block, after the context
        rows of ``features`` and ``num_new``, where given, are appended as
        :meth:`append_context` appends them: in each layer's GEMM of the block's rows where
        the block has more than ``MAX_ROWS`` rows and at most :data:`FOLD_ROWS`."""
        lane = self.lane
        n = lane.block_rows
        R = anchor.shape[0]
        context = None
        if features is not None and MAX_ROWS < R * n <= FOLD_ROWS:
            context = self.context_rows(k_cache.shape[3], features, num_new, anchor_pos)
        elif features is not None:
            self.append_context(k_cache, v_cache, features, num_new, anchor_pos)
        masks = torch.full((R, n - 1), lane.mask_token_id, dtype=torch.long,
                           device=anchor.device)
        ids = torch.cat([anchor[:, None], masks], dim=1)
        positions = anchor_pos[:, None] + torch.arange(n, device=anchor.device)
        cos, sin = self.rope(positions)
        masks = attention_masks(lane, anchor_pos, k_cache.shape[3])
        x = self.embed_tokens(ids)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, k_cache, v_cache, i, positions, masks[lane.layer_type(i)],
                      context)
        return self.norm(x)

    def drafted(self, rows: Tensor) -> Tensor:
        """The rows of :meth:`hidden_rows` that draft: all k, or the k mask rows of 1+k."""
        return rows[:, 1:] if self.lane.layout is Layout.one_plus_k else rows

    def forward(self, k_cache: Tensor, v_cache: Tensor, anchor: Tensor, anchor_pos: Tensor,
                features: Optional[Tensor] = None, num_new: Optional[Tensor] = None
                ) -> tuple[Tensor, Tensor]:
        """Hidden rows ``h [R, k, H]`` and base logits ``U [R, k, V_draft]`` of the block's
        drafted rows (:meth:`hidden_rows`)."""
        h = self.drafted(self.hidden_rows(k_cache, v_cache, anchor, anchor_pos, features,
                                          num_new))
        return h, self.lm_head(h)
