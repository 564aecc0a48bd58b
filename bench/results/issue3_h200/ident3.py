"""The runtime's setting: eager captured vs Inductor default (captured) vs reduce-overhead."""
import sys, time, warnings, logging
warnings.filterwarnings("ignore"); logging.disable(logging.WARNING)
import torch
import dspark_compile
from dspark_compile.backends import inductor
from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import lane_config
from dspark_compile.draft import KVCache, DraftStep, RoundInputs
from dspark_compile.rounds import synthetic_rounds
from dspark_compile.runtime import bind

lane_name, batch, context, DEV = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
lane = lane_config(lane_name)
d = random_drafter(lane, DEV, 0)
cuda = DEV == "cuda"

class Step(DraftStep):
    def forward(s, kc, vc, features, num_new, anchor, anchor_pos, temperature, seed):
        dd = s.drafter
        dd.append_context(kc, vc, features, num_new, anchor_pos)
        h, base = dd(kc, vc, anchor, anchor_pos)
        from dspark_compile.draft import markov_loop
        ids, prevs, z = markov_loop(dd, h, base, anchor, temperature, seed, anchor_pos)
        return ids, dd.confidences(h, prevs), h, base, z

rounds = list(synthetic_rounds(lane, batch, context, 4, 1, DEV))

def run(step, capture):
    cache = KVCache.allocate(lane, batch, DEV)
    max_context = cache.k.shape[3] - lane.block_rows - 1
    zeros = torch.zeros(batch, dtype=torch.long, device=DEV)
    feats = torch.zeros(batch, lane.k + 1, lane.feature_size, dtype=lane.torch_dtype, device=DEV)
    static = RoundInputs(feats, zeros, zeros.clone(), zeros + max_context).tensors()
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

t0 = time.time()
ref = run(Step(d), cuda)
print(f"eager done {time.time()-t0:.0f}s", flush=True)
variants = {"default_captured": (lambda: torch.compile(Step(d), fullgraph=True, dynamic=False), cuda),
            "reduce_overhead": (lambda: inductor._compiled(Step(d)), False)}
for name, (make, capture) in variants.items():
    torch._dynamo.reset()
    torch._inductor.config.emulate_precision_casts = True
    t0 = time.time()
    got = run(make(), capture)
    print(f"== {name} ({time.time()-t0:.0f}s)", flush=True)
    for i, (a, b) in enumerate(zip(ref, got)):
        detail = {n: int((x != y).sum()) for n, x, y in zip(["ids", "conf", "h", "base", "z"], a, b) if not torch.equal(x, y)}
        print(f"  round {i}: {detail or 'identical'}", flush=True)
