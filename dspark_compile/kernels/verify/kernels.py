"""Sampled verification's kernel (see :mod:`dspark_compile.kernels.verify`): one program a
row, streaming the target's logits of the row in blocks of the vocabulary."""

import triton
import triton.language as tl

from dspark_compile.kernels.noise.kernels import _key, _uniform


@triton.jit
def _softmax_stats(row_ptr, V: tl.constexpr, t, BLOCK: tl.constexpr):
    # the maximum of logits / t over a row of V and the sum of exp(logits / t - maximum)
    # (online: the sum rescaled as the maximum grows)
    cols = tl.arange(0, BLOCK)
    top = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), 0)
    total = tl.sum(tl.zeros([BLOCK], tl.float32), 0)
    for start in range(0, V, BLOCK):
        x = tl.load(row_ptr + start + cols, mask=start + cols < V, other=float("-inf")) / t
        new_top = tl.maximum(top, tl.max(x, 0))
        total = total * tl.exp(top - new_top) + tl.sum(tl.exp(x - new_top), 0)
        top = new_top
    return top, total


@triton.jit
def verify_kernel(ids_ptr, ids_stride, q_ptr, q_stride_row, q_stride_step, logits_ptr,
                  logits_stride_row, logits_stride_step, rows_ptr, lengths_ptr, seed_ptr,
                  position_ptr, accepted_ptr, tokens_ptr, t, step, V: tl.constexpr,
                  K: tl.constexpr, HAS_LENGTHS: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    row = tl.load(rows_ptr + r)  # the row of the target's pass (and of the drafts)
    logits_row = logits_ptr + row * logits_stride_row
    q_row = q_ptr + r.to(tl.int64) * q_stride_row
    key = _key(tl.load(seed_ptr + r), tl.load(position_ptr + r), step)
    drafted = r * 0 + K
    if HAS_LENGTHS:
        drafted = tl.load(lengths_ptr + r).to(tl.int32)
    # the accepted prefix, and the softmax statistics of the position after it
    going = r == r  # every draft so far accepted
    accepted = r * 0
    top, total = _softmax_stats(logits_row + K * logits_stride_step, V, t, BLOCK)
    for j in tl.static_range(K):
        top_j, total_j = _softmax_stats(logits_row + j * logits_stride_step, V, t, BLOCK)
        x = tl.load(ids_ptr + row * ids_stride + j)
        p = tl.exp(tl.load(logits_row + j * logits_stride_step + x) / t - top_j) / total_j
        q = tl.where(j < drafted, tl.load(q_row + j * q_stride_step + x), 0.0)
        accept = (_uniform(key, j) * q.to(tl.float64) < p.to(tl.float64)) & (q > 0)
        stops = going & ~accept
        top, total = tl.where(stops, top_j, top), tl.where(stops, total_j, total)
        going = going & accept
        accepted += going.to(accepted.dtype)
    # the token after the prefix: from max(0, p - q) normalised (q of the next draft, if
    # it was verified), or from p where nothing is left; the first whose cumulative mass
    # passes u of the total
    p_row = logits_row + accepted * logits_stride_step
    q_next = q_row + tl.maximum(tl.minimum(accepted, K - 1), 0) * q_stride_step
    verified = accepted < drafted  # else q is 0 there: every verified draft passed
    cols = tl.arange(0, BLOCK)
    mass = tl.sum(tl.zeros([BLOCK], tl.float64), 0)
    p_mass = tl.sum(tl.zeros([BLOCK], tl.float64), 0)
    for start in range(0, V, BLOCK):
        inside = start + cols < V
        p = tl.exp(tl.load(p_row + start + cols, mask=inside, other=float("-inf")) / t - top) \
            / total
        q = tl.load(q_next + start + cols, mask=inside & verified, other=0.0)
        mass += tl.sum(tl.maximum(p - q, 0.0).to(tl.float64), 0)
        p_mass += tl.sum(p.to(tl.float64), 0)
    use_p = mass == 0  # p == q: nothing left to correct
    threshold = _uniform(key, K) * tl.where(use_p, p_mass, mass)
    before = tl.sum(tl.zeros([BLOCK], tl.float64), 0)
    pick = V + r * 0  # none yet
    last = r * 0  # the last token of any mass: the pick if rounding leaves none past u
    for start in range(0, V, BLOCK):
        inside = start + cols < V
        p = tl.exp(tl.load(p_row + start + cols, mask=inside, other=float("-inf")) / t - top) \
            / total
        q = tl.load(q_next + start + cols, mask=inside & verified, other=0.0)
        weight = tl.where(use_p, p.to(tl.float64), tl.maximum(p - q, 0.0).to(tl.float64))
        passed = (before + tl.cumsum(weight, 0) > threshold) & inside
        pick = tl.minimum(pick, tl.min(tl.where(passed, start + cols, V), 0))
        last = tl.maximum(last, tl.max(tl.where(weight > 0, start + cols, 0), 0))
        before += tl.sum(weight, 0)
    pick = tl.where(pick < V, pick, last)
    for j in tl.static_range(K + 1):
        token = tl.load(ids_ptr + row * ids_stride + j) if j < K else 0
        tl.store(tokens_ptr + r * (K + 1) + j, tl.where(j == accepted, pick, token))
    tl.store(accepted_ptr + r, accepted)
