"""Localise eager-vs-Inductor differences of the whole draft step: per-layer outputs."""
import sys, time, warnings, logging
warnings.filterwarnings("ignore"); logging.disable(logging.WARNING)
import torch, torch._inductor.config as ic
import dspark_compile
from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import lane_config
from dspark_compile.draft import KVCache, markov_loop
from dspark_compile.rounds import synthetic_rounds

lane_name, batch, DEV = sys.argv[1], int(sys.argv[2]), sys.argv[3]
lane = lane_config(lane_name)
d = random_drafter(lane, DEV, 0)

class Step(torch.nn.Module):
    def __init__(s, d, layers): super().__init__(); s.d = d; s.nl = layers
    def forward(s, kc, vc, features, num_new, anchor, anchor_pos, temperature, seed):
        d = s.d; n = lane.block_rows; R = anchor.shape[0]
        d.append_context(kc, vc, features, num_new, anchor_pos)
        masks = torch.full((R, n - 1), lane.mask_token_id, dtype=torch.long, device=anchor.device)
        ids = torch.cat([anchor[:, None], masks], dim=1)
        positions = anchor_pos[:, None] + torch.arange(n, device=anchor.device)
        cos, sin = d.rope(positions)
        mask = d.block_mask(anchor_pos, kc.shape[3])
        x = d.embed_tokens(ids)
        outs = [x]
        for i, layer in enumerate(d.layers[:s.nl]):
            a = layer.self_attn(layer.input_layernorm(x), cos, sin, kc, vc, i, positions, mask)
            outs.append(a)
            x = x + a
            outs.append(x)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            outs.append(x)
        h = d.norm(x)
        base = d.lm_head(h)
        ids, prevs, z = markov_loop(d, h, base, anchor, temperature, seed, anchor_pos)
        return (ids, h, base, z, *outs)

def run(fn, rounds):
    cache = KVCache.allocate(lane, batch, DEV, max_context=1024)
    with torch.no_grad():
        return [[t.clone() for t in fn(cache.k, cache.v, *r.tensors())] for r in rounds]

rounds = list(synthetic_rounds(lane, batch, 512, 3, 1, DEV))
variants = [("full", lane.num_layers, {}), ("no_pattern_matcher", lane.num_layers, {"pattern_matcher": False}),
            ("layer0", 1, {})]
for name, layers, patch in variants:
    ref = run(Step(d, layers), rounds)
    torch._dynamo.reset()
    ic.emulate_precision_casts = True
    t0 = time.time()
    with ic.patch(patch):
        got = run(torch.compile(Step(d, layers), fullgraph=True, dynamic=False), rounds)
    names = ["ids", "h", "base", "z"] + ["x0"] + [f"L{i}.{p}" for i in range(layers) for p in ("attn", "mid", "out")]
    print(f"== {name} ({time.time()-t0:.0f}s)", flush=True)
    for i, (a, b) in enumerate(zip(ref, got)):
        detail = {n: int((x != y).sum()) for n, x, y in zip(names, a, b) if not torch.equal(x, y)}
        print(f"  round {i}: {detail or 'identical'}", flush=True)
