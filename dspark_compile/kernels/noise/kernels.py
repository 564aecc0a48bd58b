"""The counter-based noise's kernel (see :mod:`dspark_compile.kernels.noise`)."""

import triton
import triton.language as tl

from dspark_compile.kernels.markov.tiles import _mix


@triton.jit
def uniform_kernel(seed_ptr, position_ptr, out_ptr, size, step, BLOCK: tl.constexpr):
    # one row's key (the Markov kernels' keys: rng's on uint32), then BLOCK of its indices,
    # the program_id(1)-th block
    row = tl.program_id(0)
    key = _mix(tl.load(seed_ptr + row).to(tl.uint32))
    key = _mix(key ^ tl.load(position_ptr + row).to(tl.uint32))
    key = _mix(key ^ step)
    index = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    h = _mix(key ^ index.to(tl.uint32))
    u = (h.to(tl.float64) + 0.5) / 4294967296.0  # exact: h < 2^32, a power-of-two scale
    tl.store(out_ptr + row.to(tl.int64) * size + index, u, mask=index < size)
