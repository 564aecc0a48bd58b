"""The counter-based noise's kernel (see :mod:`dspark_compile.kernels.noise`)."""

import triton
import triton.language as tl


@triton.jit
def _mix(x):
    # rng._mix: shifts of non-negative values are its floor divisions
    mask = tl.full((), 0xFFFFFFFF, tl.int64)
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & mask
    x = x ^ (x >> 15)
    x = (x * 0x5BD1E995) & mask
    return x ^ (x >> 16)


@triton.jit
def uniform_kernel(seed_ptr, position_ptr, out_ptr, size, step, BLOCK: tl.constexpr):
    # one row's key hashed once, then BLOCK of its indices: the program_id(1)-th block
    row = tl.program_id(0)
    mask = tl.full((), 0xFFFFFFFF, tl.int64)
    h = _mix(tl.load(seed_ptr + row).to(tl.int64) & mask)
    h = _mix(h ^ (tl.load(position_ptr + row).to(tl.int64) & mask))
    h = _mix(h ^ tl.full((), step, tl.int64))
    index = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    h = _mix(h ^ index.to(tl.int64))
    u = (h.to(tl.float64) + 0.5) / 4294967296.0  # exact: h < 2^32, a power-of-two scale
    tl.store(out_ptr + row.to(tl.int64) * size + index, u, mask=index < size)
