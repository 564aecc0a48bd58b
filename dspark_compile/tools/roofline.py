"""The floor of one draft round: the larger of (bytes it must move) / (copy bandwidth
measured now) and (FLOPs it must do) / (matmul rate measured now), at the lane's shapes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dspark_compile.config import LaneConfig
from dspark_compile.model import Drafter
from dspark_compile.tools.timing import time_ms


@dataclass
class Ceilings:
    bandwidth: float  # bytes/s, read + write of a large device copy
    matmul: float     # FLOP/s of a large square matmul in the lane's dtype


@dataclass
class Floor:
    bytes: int
    flops: int
    ms: float
    # writing the base logits [R, k, V] and reading them back, at the measured bandwidth:
    # traffic the floor leaves out, which only fusing the lm_head into the loop would save
    logits_ms: float


def measure_ceilings(device: torch.device, dtype: torch.dtype) -> Ceilings:
    big = (1 << 28) if device.type == "cuda" else (1 << 24)  # elements of a copy
    src = torch.ones(big, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    copy_ms = time_ms(lambda: dst.copy_(src), device, repeats=10, warmup=2)
    n = 8192 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    mm_ms = time_ms(lambda: a @ b, device, repeats=10, warmup=2)
    return Ceilings(bandwidth=2 * src.numel() * 4 / (copy_ms / 1e3),
                    matmul=2 * n ** 3 / (mm_ms / 1e3))


def round_floor(drafter: Drafter, batch: int, context: int, ceilings: Ceilings) -> Floor:
    """Bytes and FLOPs one decode round must move and do at these shapes."""
    lane: LaneConfig = drafter.lane
    size = torch.finfo(lane.torch_dtype).bits // 8
    w2 = 0 if drafter.markov_head is None else drafter.markov_head.markov_w2.weight.numel()
    # every weight once, W2 once per step; embeddings and W1 only as rows (negligible)
    params = sum(p.numel() for name, p in drafter.named_parameters()
                 if name not in ("embed_tokens.weight", "markov_head.markov_w1.weight"))
    weight_bytes = (params + (lane.k - 1) * w2) * size
    new_rows, rows = lane.k + 1, lane.block_rows
    # the keys each layer sees: a sliding layer's window and the block
    keys = sum(min(context, lane.sliding_window) + rows
               if lane.layer_type(i) == "sliding_attention" else context + rows
               for i in range(lane.num_layers))
    kv_bytes = 2 * batch * lane.num_kv_heads * keys * lane.head_dim * size
    H, q, kv = lane.hidden_size, lane.num_heads * lane.head_dim, lane.num_kv_heads * lane.head_dim
    append = new_rows * (lane.feature_size * H + lane.num_layers * 2 * H * kv)
    layer = H * q + 2 * H * kv + q * H + 3 * H * lane.intermediate_size
    attention = 2 * lane.num_heads * rows * lane.head_dim  # per key seen
    heads = lane.k * H * lane.draft_vocab_size + lane.k * lane.markov_rank * lane.draft_vocab_size
    flops = 2 * batch * (append + lane.num_layers * rows * layer + keys * attention + heads)
    total_bytes = weight_bytes + kv_bytes + batch * new_rows * lane.feature_size * size
    ms = max(total_bytes / ceilings.bandwidth, flops / ceilings.matmul) * 1e3
    logits_bytes = 2 * batch * lane.k * lane.draft_vocab_size * size
    return Floor(bytes=int(total_bytes), flops=int(flops), ms=ms,
                 logits_ms=logits_bytes / ceilings.bandwidth * 1e3)
