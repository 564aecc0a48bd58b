"""Variants of the resident walk, timed in one run against the kernel of commit 4ed3daa
(``shipped``) on the 35B-A3B lane: ``variants.json``.

Runs against 4ed3daa's ``dspark_compile`` (it imports that ``fused_markov``'s helpers), from
the repository root, with this file and its R-at-compile-time twin in ``diag/``:

    cp walk_variants.py diag/
    sed -e 's/count_ptr, ids_ptr, R, V, base_stride,/count_ptr, ids_ptr, R: tl.constexpr, V, base_stride,/' \
        -e '/^main()$/d' diag/walk_variants.py > diag/walk_rc_lib.py
    python3 diag/walk_variants.py qwen36_35b_a3b 1,2,8,16 variants.json

Flags: RCONST (R a compile-time constant), ROWMASK (the reduction loads only the
requests' rows), W1D (a W1 indexed by draft id, ``W1[d2t]``, built outside: no d2t hop
before ``W1[prev]``), POLL (spin on a plain load of the count), TGATHER (publish the target
id with the index), TAGGED (bests published as two tagged 64-bit words, no count), NOSYNC
(no waiting at all: wrong ids, a lower bound). ``copy`` is the shipped walk with ``e``
loaded right after the reduction.
"""
import itertools, statistics, sys, json
import torch, triton, triton.language as tl
sys.path[:0] = ["scripts", "diag"]
from markov_loop_bench import random_head, replay_ms
from dspark_compile import fused_markov as fm
from dspark_compile.fused_markov import _row_inputs, _base_tile, _tile_update, _round_bf16, _mix
from dspark_compile.config import lane_config


@triton.jit
def _reduce_v(best_ptr, index_ptr, rows, row_ok, PROGRAMS: tl.constexpr, PARTS: tl.constexpr,
              ROWMASK: tl.constexpr):
    parts = tl.arange(0, PARTS)
    ok = (parts < PROGRAMS)[None, :]
    if ROWMASK:
        ok = ok & row_ok[:, None]
    offsets = rows[:, None] * PROGRAMS + parts[None, :]
    part_best = tl.load(best_ptr + offsets, mask=ok, other=float("-inf"), cache_modifier=".cg")
    part_index = tl.load(index_ptr + offsets, mask=ok, other=0, cache_modifier=".cg")
    chunk_best = tl.max(part_best, axis=1)
    return tl.min(tl.where(part_best == chunk_best[:, None], part_index, 1 << 30), axis=1).to(tl.int64)


@triton.jit
def _tagged_exchange(best, index, hi_ptr, lo_ptr, rows, row_ok, program, tag,
                     PROGRAMS: tl.constexpr, PARTS: tl.constexpr):
    bits = best.to(tl.int64, bitcast=True)
    ordered = bits ^ ((bits >> 63) & 0x7FFFFFFFFFFFFFFF)
    low = index.to(tl.int64) | (tag << 24)
    hi_word = (ordered >> 32 << 32) | low
    lo_word = (ordered << 32) | low
    at = rows * PROGRAMS + program
    tl.atomic_xchg(hi_ptr + at, hi_word, mask=row_ok, sem="relaxed", scope="gpu")
    tl.atomic_xchg(lo_ptr + at, lo_word, mask=row_ok, sem="relaxed", scope="gpu")
    parts = tl.arange(0, PARTS)
    ok = (parts < PROGRAMS)[None, :] & row_ok[:, None]
    offsets = rows[:, None] * PROGRAMS + parts[None, :]
    hi = tl.zeros((rows.shape[0], PARTS), tl.int64)
    lo = tl.zeros((rows.shape[0], PARTS), tl.int64)
    ready = False
    while not ready:
        hi = tl.load(hi_ptr + offsets, mask=ok, other=0, volatile=True)
        lo = tl.load(lo_ptr + offsets, mask=ok, other=0, volatile=True)
        here = (((hi >> 24) & 0xFF) == tag) & (((lo >> 24) & 0xFF) == tag)
        ready = tl.min((here | ~ok).to(tl.int32)) == 1
    key = (hi >> 32 << 32) | ((lo >> 32) & 0xFFFFFFFF)
    key = tl.where(ok, key, -0x7FFFFFFFFFFFFFFF)
    top = tl.max(key, axis=1)
    return tl.min(tl.where(key == top[:, None], hi & 0xFFFFFF, 1 << 30), axis=1).to(tl.int64)


@triton.jit
def walk(w1_ptr, w1d_ptr, w2_ptr, base_ptr, anchor_ptr, temperature_ptr, seed_ptr, position_ptr,
         d2t_ptr, best_ptr, index_ptr, count_ptr, ids_ptr, R, V, base_stride,
         K: tl.constexpr, RANK: tl.constexpr, R_PAD: tl.constexpr, BLOCK: tl.constexpr,
         PROGRAMS: tl.constexpr, PARTS: tl.constexpr, W1D: tl.constexpr, POLL: tl.constexpr,
         ROWMASK: tl.constexpr, NOSYNC: tl.constexpr, TGATHER: tl.constexpr,
         TAGGED: tl.constexpr):
    program = tl.program_id(0)
    rows = tl.arange(0, R_PAD)
    row_ok = rows < R
    t, hot, any_hot, key = _row_inputs(temperature_ptr, seed_ptr, position_ptr, rows, row_ok)
    columns = tl.arange(0, BLOCK)
    cols = program * BLOCK + columns
    w2 = tl.load(w2_ptr + cols[:, None] * RANK + tl.arange(0, RANK)[None, :],
                 mask=(cols < V)[:, None], other=0.0)
    if TGATHER:
        target_tile = tl.load(d2t_ptr + cols, mask=cols < V, other=0) + cols
    prev = tl.load(anchor_ptr + rows, mask=row_ok, other=0)
    e = tl.load(w1_ptr + prev[:, None] * RANK + tl.arange(0, RANK)[None, :],
                mask=row_ok[:, None], other=0.0)
    next_base = _base_tile(base_ptr + rows * base_stride, program, V, row_ok, BLOCK)
    for step in range(K):
        base = next_base
        next_base = _base_tile(base_ptr + rows * base_stride + (step + 1) * V, program, V,
                               row_ok & (step + 1 < K), BLOCK)
        bias = _round_bf16(tl.trans(tl.dot(w2, tl.trans(e), out_dtype=tl.float32)))
        best, index = _tile_update(tl.full((R_PAD,), float("-inf"), tl.float64),
                                   tl.zeros((R_PAD,), tl.int32), bias, base, program, V, t,
                                   hot, any_hot, _mix(key ^ step), BLOCK)
        slot = (step % 2) * R_PAD * PROGRAMS
        if TAGGED:
            win = _tagged_exchange(best + 0.0, index, index_ptr + 2 * R_PAD * PROGRAMS + slot,
                                   index_ptr + slot, rows, row_ok, program, step + 1,
                                   PROGRAMS, PARTS)
        else:
            if TGATHER:
                local = index - program * BLOCK
                packed = (index.to(tl.int64) << 32) | tl.gather(target_tile, local, 0).to(tl.int64)
            else:
                packed = index.to(tl.int64)
            tl.store(best_ptr + slot + rows * PROGRAMS + program, best)
            tl.store(index_ptr + slot + rows * PROGRAMS + program, packed)
            if not NOSYNC:
                tl.debug_barrier()
                tl.atomic_add(count_ptr + step, 1, sem="release")
                arrived = False
                if POLL:
                    while not arrived:
                        arrived = tl.load(count_ptr + step, volatile=True) == PROGRAMS
                    tl.atomic_add(count_ptr + step, 0, sem="acquire")
                else:
                    while not arrived:
                        arrived = tl.atomic_add(count_ptr + step, 0, sem="acquire") == PROGRAMS
            win = _reduce_v(best_ptr + slot, index_ptr + slot, rows, row_ok, PROGRAMS, PARTS, ROWMASK)
        if TGATHER:
            target = win & 0xFFFFFFFF
            e = tl.load(w1_ptr + target[:, None] * RANK + tl.arange(0, RANK)[None, :],
                        mask=row_ok[:, None], other=0.0)
        elif W1D:
            e = tl.load(w1d_ptr + win[:, None] * RANK + tl.arange(0, RANK)[None, :],
                        mask=row_ok[:, None], other=0.0)
            target = win
        else:
            target = win + tl.load(d2t_ptr + win, mask=row_ok, other=0)
            e = tl.load(w1_ptr + target[:, None] * RANK + tl.arange(0, RANK)[None, :],
                        mask=row_ok[:, None], other=0.0)
        if program == 0:
            if W1D:
                target += tl.load(d2t_ptr + win, mask=row_ok, other=0)
            tl.store(ids_ptr + rows * K + step, target, mask=row_ok)


FLAGS = ("RCONST", "W1D", "POLL", "ROWMASK", "NOSYNC", "TGATHER", "TAGGED")


def run_variant(flags, w1, w1d, w2, base, anchor, temperature, seed, pos, d2t, sms):
    R, k, V = base.shape
    launch = fm.launch_shape(R, V, w1.shape[1], sms)
    assert launch.resident
    programs = triton.cdiv(V, launch.block)
    make = torch.zeros if ("TAGGED" in flags or "NOSYNC" in flags) else torch.empty
    wide = "TAGGED" in flags or "TGATHER" in flags
    best = make(2 * launch.rows * programs, dtype=torch.float64, device=base.device)
    index = make((4 if wide else 2) * launch.rows * programs, dtype=torch.int64 if wide else torch.int32,
                 device=base.device)
    count = torch.zeros(k, dtype=torch.int32, device=base.device)
    ids = torch.empty(R, k, dtype=torch.int64, device=base.device)
    kernel = walk_rc if "RCONST" in flags else walk
    kernel[(programs,)](w1, w1d, w2, base, anchor, temperature, seed, pos, d2t, best, index, count,
                      ids, R, V, base.stride(0), K=k, RANK=w1.shape[1], R_PAD=launch.rows,
                      BLOCK=launch.block, PROGRAMS=programs,
                      PARTS=1 << (programs - 1).bit_length(), num_warps=launch.warps,
                      **{f: f in flags for f in FLAGS if f != "RCONST"})
    return ids


try:
    from walk_rc_lib import walk as walk_rc
except ImportError:
    walk_rc = None


def main():
    if sys.argv[3:4] == ["profile"]:
        return profile()
    lane_name = sys.argv[1]
    batches = [int(b) for b in sys.argv[2].split(",")]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    lane = lane_config(lane_name)
    gen = torch.Generator(device=device).manual_seed(0)
    head, d2t = random_head(lane, gen)
    w1, w2 = head.markov_w1.weight.detach(), head.markov_w2.weight.detach()
    w1d = w1[torch.arange(lane.draft_vocab_size, device=device) + d2t].contiguous()
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    variants = [(), ("RCONST",), ("RCONST", "ROWMASK"), ("RCONST", "ROWMASK", "W1D"),
                ("RCONST", "TAGGED", "W1D"), ("ROWMASK", "W1D"), (), ("RCONST",),
                ("RCONST", "ROWMASK", "W1D")]
    out = []
    for R in batches:
        base = torch.randn(R, lane.k, lane.draft_vocab_size, device=device, generator=gen,
                           dtype=lane.torch_dtype)
        anchor = torch.randint(0, lane.target_vocab_size, (R,), device=device, generator=gen)
        temperature = torch.zeros(R, device=device)
        seed = torch.arange(R, device=device) + 7
        pos = torch.full((R,), 4096, device=device)
        ref = fm.markov_walk(w1, w2, base, anchor, temperature, seed, pos, d2t)
        calls = {"shipped": lambda: fm.markov_walk(w1, w2, base, anchor, temperature, seed, pos, d2t)}
        for i, v in enumerate(variants):
            calls[("+".join(v) or "copy") + ("" if v not in variants[:i] else " again")] = (lambda v=v: run_variant(v, w1, w1d, w2, base, anchor,
                                                                   temperature, seed, pos, d2t, sms))
        for name, call in calls.items():
            diff = int((call() != ref).sum())
            if device.type != "cuda":
                print(R, name, "differ", diff, flush=True)
                continue
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                call()
            ms = [replay_ms(graph) for _ in range(3)]
            print(f"{R:3d} {name:28s} {min(ms):.4f} ms {ms} differ {diff}", flush=True)
            out.append(dict(batch=R, variant=name, ms=ms, differ=diff))
    if device.type == "cuda":
        json.dump(out, open(sys.argv[3], "w"), indent=1)


def profile():
    lane = lane_config(sys.argv[1])
    R = int(sys.argv[2])
    flags = [] if sys.argv[4] == "copy" else sys.argv[4].split("+")
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    head, d2t = random_head(lane, gen)
    w1, w2 = head.markov_w1.weight.detach(), head.markov_w2.weight.detach()
    w1d = w1[torch.arange(lane.draft_vocab_size, device=device) + d2t].contiguous()
    base = torch.randn(R, lane.k, lane.draft_vocab_size, device=device, generator=gen, dtype=lane.torch_dtype)
    anchor = torch.randint(0, lane.target_vocab_size, (R,), device=device, generator=gen)
    for _ in range(4):
        run_variant(flags, w1, w1d, w2, base, anchor, torch.zeros(R, device=device),
                    torch.arange(R, device=device) + 7, torch.full((R,), 4096, device=device), d2t, 132)
    torch.cuda.synchronize()


main()
