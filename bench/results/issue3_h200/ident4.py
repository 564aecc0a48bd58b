"""Bench-like DraftStep (ids, confidences only): the old Markov rounding vs `rounded`."""
import sys, time, warnings, logging
warnings.filterwarnings("ignore"); logging.disable(logging.WARNING)
import torch
import dspark_compile
import dspark_compile.draft; D = sys.modules["dspark_compile.draft"]
from dspark_compile.backends import inductor
from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import lane_config
from dspark_compile.draft import KVCache, DraftStep, RoundInputs
from dspark_compile.model.vocab import to_target
from dspark_compile.rounds import synthetic_rounds
from dspark_compile.runtime import bind

lane_name, batch, context, DEV = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
lane = lane_config(lane_name)
d = random_drafter(lane, DEV, 0)
new_loop = D.markov_loop

def old_loop(drafter, h, base_logits, anchor, temperature, seed, anchor_pos):
    head = drafter.markov_head
    prev, state = anchor, head.initial_state(h)
    wide = torch.promote_types(base_logits.dtype, torch.float32)
    ids, prevs, logits = [], [], []
    for step in range(base_logits.shape[1]):
        bias, state = head.step_bias(prev, h[:, step], state)
        z = (base_logits[:, step].to(wide) + bias.to(wide)).to(bias.dtype)
        prevs.append(prev)
        prev = to_target(D.sample(z, temperature, seed, anchor_pos, step), drafter.d2t)
        ids.append(prev)
        logits.append(z)
    return torch.stack(ids, 1), torch.stack(prevs, 1), torch.stack(logits, 1)

rounds = list(synthetic_rounds(lane, batch, context, 4, 1, DEV, temperature=1.0))

def run(step, capture):
    cache = KVCache.allocate(lane, batch, DEV)
    max_context = cache.k.shape[3] - lane.block_rows - 1
    zeros = torch.zeros(batch, dtype=torch.long, device=DEV)
    feats = torch.zeros(batch, lane.k + 1, lane.feature_size, dtype=lane.torch_dtype, device=DEV)
    static = RoundInputs(feats, zeros, zeros.clone(), zeros + max_context,
                         torch.zeros(batch, device=DEV), zeros.clone()).tensors()
    with torch.no_grad():
        call = bind(step, (cache.k, cache.v, *static), capture)
        outs = []
        for i, r in enumerate(rounds):
            t = r.tensors()
            if i == 0:
                d.append_context(cache.k, cache.v, t[0], t[1], t[3])
                t = (static[0], torch.zeros_like(t[1]), *t[2:])
            for b, x in zip(static, t):
                if b is not x: b.copy_(x)
            outs.append([o.clone() for o in call()])
    return outs

for name, loop in [("old rounding", old_loop), ("rounded()", new_loop)]:
    D.markov_loop = loop
    ref = run(DraftStep(d), DEV == "cuda")
    torch._dynamo.reset()
    t0 = time.time()
    got = run(inductor._compiled(DraftStep(d)), False)
    print(f"== {name} ({time.time()-t0:.0f}s) batch {batch} context {context}, odd rows T=1", flush=True)
    for i, (a, b) in enumerate(zip(ref, got)):
        detail = {n: int((x != y).sum()) for n, x, y in zip(["ids", "conf"], a, b) if not torch.equal(x, y)}
        print(f"  round {i}: {detail or 'identical'}", flush=True)
