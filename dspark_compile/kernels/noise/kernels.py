"""The counter-based noise's kernel (see :mod:`dspark_compile.kernels.noise`), and its
device functions for other kernels that draw the same noise."""

import triton
import triton.language as tl

from dspark_compile.kernels.markov.tiles import _mix


@triton.jit
def _key(seed, position, step):
    # one row's key (the Markov kernels' keys: rng's on uint32)
    key = _mix(seed.to(tl.uint32))
    key = _mix(key ^ position.to(tl.uint32))
    return _mix(key ^ step)


@triton.jit
def _uniform(key, index):
    # rng.uniform's value at ``index`` (uint32, or a constant): exact, h < 2^32 and a
    # power-of-two scale
    h = _mix(key ^ index)
    return (h.to(tl.float64) + 0.5) / 4294967296.0


@triton.jit(do_not_specialize=["size"])  # a size of 1 too: one compile for every size
def uniform_kernel(seed_ptr, position_ptr, out_ptr, size, step, BLOCK: tl.constexpr):
    # BLOCK of one row's values, the program_id(1)-th block
    row = tl.program_id(0)
    key = _key(tl.load(seed_ptr + row), tl.load(position_ptr + row), step)
    index = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + row.to(tl.int64) * size + index, _uniform(key, index.to(tl.uint32)),
             mask=index < size)
