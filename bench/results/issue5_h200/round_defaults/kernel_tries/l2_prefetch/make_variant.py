import sys, re
tree, pfw, pfb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
p = f"{tree}/dspark_compile/fused_markov.py"; s = open(p).read()
helper = f'''    PF_W2 = tl.constexpr({pfw})
    PF_BASE = tl.constexpr({pfb})

    @triton.jit
    def _prefetch(ptrs):
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs],
                                  dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def _markov_step_kernel('''
s = s.replace("    @triton.jit\n    def _markov_step_kernel(", helper, 1)
old = "            tile = program * RUN + nth\n            base = next_base\n"
new = old + '''            if PF_W2 > 0:
                _prefetch(w2_ptr + tl.minimum((tile + PF_W2) * BLOCK * RANK
                                              + tl.arange(0, BLOCK * RANK // 16) * 16,
                                              V * RANK - 16))
            if PF_BASE > 0:
                pf_cols = tl.minimum((tile + PF_BASE) * BLOCK + tl.arange(0, BLOCK // 16) * 16,
                                     V - 16)
                _prefetch(base_ptr + tl.minimum(rows, R - 1)[:, None] * base_stride + step * V
                          + pf_cols[None, :])
'''
assert old in s
s = s.replace(old, new, 1)
open(p, "w").write(s)
