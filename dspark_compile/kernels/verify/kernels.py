"""Sampled verification's kernel (see :mod:`dspark_compile.kernels.verify`): one program a
row. It streams the row's logits three times, in blocks of the vocabulary: every position
at once for the softmax statistics, then the position after the accepted prefix twice, for
the correction's total mass and its pick."""

import triton
import triton.language as tl

from dspark_compile.kernels.noise.kernels import _key, _uniform


@triton.jit
def _probs(row_ptr, cols, V: tl.constexpr, t, top, total):
    # softmax(logits / t) of one position's columns, from its statistics
    x = tl.load(row_ptr + cols, mask=cols < V, other=float("-inf"))
    return tl.exp(x / t - top) / total


# K and the drafts' row stride are the verify width: never specialized (Triton would
# compile again for a width of 1, or 0), so one compile serves every width
@triton.jit(do_not_specialize=["K", "ids_stride"])
def verify_kernel(ids_ptr, ids_stride, q_ptr, q_stride_row, q_stride_step, logits_ptr,
                  logits_stride_row, logits_stride_step, rows_ptr, lengths_ptr, seed_ptr,
                  position_ptr, accepted_ptr, tokens_ptr, t, step, K, V: tl.constexpr,
                  POSITIONS: tl.constexpr, HAS_LENGTHS: tl.constexpr, BLOCK: tl.constexpr,
                  BLOCK_ROW: tl.constexpr):
    # K drafts a row, K + 1 <= POSITIONS (a power of two)
    r = tl.program_id(0)
    row = tl.load(rows_ptr + r)  # the row of the target's pass (and of the drafts)
    logits_row = logits_ptr + row * logits_stride_row
    q_row = q_ptr + r.to(tl.int64) * q_stride_row
    key = _key(tl.load(seed_ptr + r), tl.load(position_ptr + r), step)
    drafted = r * 0 + K
    if HAS_LENGTHS:
        drafted = tl.load(lengths_ptr + r).to(tl.int32)
    # each position's maximum of logits / t and sum of exp(logits / t - maximum), online
    j = tl.arange(0, POSITIONS)
    real = j < K + 1
    top = tl.full([POSITIONS], float("-inf"), tl.float32)
    total = tl.zeros([POSITIONS], tl.float32)
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(logits_row + j[:, None] * logits_stride_step + cols[None, :],
                    mask=real[:, None] & (cols < V)[None, :], other=float("-inf")) / t
        x = tl.where(real[:, None], x, 0.0)  # padding positions: finite, never read
        new_top = tl.maximum(top, tl.max(x, 1))
        total = total * tl.exp(top - new_top) + tl.sum(tl.exp(x - new_top[:, None]), 1)
        top = new_top
    # draft j is accepted with probability min(1, p_j(x_j) / q_j(x_j)); q is 0 past the
    # row's verify length
    is_draft = j < K
    ids = tl.load(ids_ptr + row * ids_stride + j, mask=is_draft, other=0)
    p_draft = tl.exp(tl.load(logits_row + j * logits_stride_step + ids, mask=is_draft,
                             other=0.0) / t - top) / total
    q_draft = tl.load(q_row + j * q_stride_step + ids, mask=is_draft & (j < drafted), other=0.0)
    accept = (_uniform(key, j.to(tl.uint32)) * q_draft.to(tl.float64)
              < p_draft.to(tl.float64)) & (q_draft > 0)
    accepted = tl.min(tl.where(is_draft & ~accept, j, K), 0)
    top = tl.sum(tl.where(j == accepted, top, 0.0), 0)
    total = tl.sum(tl.where(j == accepted, total, 0.0), 0)
    # the token after the prefix: from max(0, p - q) normalised (q of the next draft, if
    # it was verified, else 0: every verified draft passed), or from p where nothing is
    # left; the first whose cumulative mass passes u of the total
    p_row = logits_row + accepted * logits_stride_step
    q_next = q_row + tl.maximum(tl.minimum(accepted, K - 1), 0) * q_stride_step
    verified = accepted < drafted
    mass = tl.sum(tl.zeros([BLOCK_ROW], tl.float64), 0)
    p_mass = tl.sum(tl.zeros([BLOCK_ROW], tl.float64), 0)
    for start in range(0, V, BLOCK_ROW):
        cols = start + tl.arange(0, BLOCK_ROW)
        p = _probs(p_row, cols, V, t, top, total)
        q = tl.load(q_next + cols, mask=(cols < V) & verified, other=0.0)
        mass += tl.sum(tl.maximum(p - q, 0.0).to(tl.float64), 0)
        p_mass += tl.sum(p.to(tl.float64), 0)
    use_p = mass == 0  # q >= p everywhere: nothing left to correct
    threshold = _uniform(key, K.to(tl.uint32)) * tl.where(use_p, p_mass, mass)
    before = tl.sum(tl.zeros([BLOCK_ROW], tl.float64), 0)
    pick = V + r * 0  # none yet
    last = r * 0  # the last token of any mass: the pick if rounding leaves none past u
    for start in range(0, V, BLOCK_ROW):
        cols = start + tl.arange(0, BLOCK_ROW)
        p = _probs(p_row, cols, V, t, top, total)
        q = tl.load(q_next + cols, mask=(cols < V) & verified, other=0.0)
        weight = tl.where(use_p, p.to(tl.float64), tl.maximum(p - q, 0.0).to(tl.float64))
        passed = (before + tl.cumsum(weight, 0) > threshold) & (cols < V)
        pick = tl.minimum(pick, tl.min(tl.where(passed, cols, V), 0))
        last = tl.maximum(last, tl.max(tl.where(weight > 0, cols, 0), 0))
        before += tl.sum(weight, 0)
    pick = tl.where(pick < V, pick, last)
    # the drafts, then 0, with the pick after the accepted prefix
    tl.store(tokens_ptr + r * (K + 1) + j, tl.where(j == accepted, pick, ids), mask=real)
    tl.store(accepted_ptr + r, accepted)
