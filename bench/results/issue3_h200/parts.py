"""Which part of the 35B block differs between eager and Inductor: each module compiled alone
on the inputs eager saw in a decode round, outputs compared bit for bit."""
import sys, warnings, logging
warnings.filterwarnings("ignore"); logging.disable(logging.WARNING)
import torch, torch._inductor.config as ic
import torch.nn.functional as F
import dspark_compile
from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import lane_config
from dspark_compile.draft import KVCache, DraftStep
from dspark_compile.model import backbone as bb
from dspark_compile.rounds import synthetic_rounds

lane_name, batch, DEV = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ic.emulate_precision_casts = True
lane = lane_config(lane_name)
d = random_drafter(lane, DEV, 0)
rounds = list(synthetic_rounds(lane, batch, 512, 2, 1, DEV))
cache = KVCache.allocate(lane, batch, DEV, max_context=1024)
step = DraftStep(d)
with torch.no_grad():
    step(cache.k, cache.v, *rounds[0].tensors())
seen = {}
def clone(x): return x.clone() if isinstance(x, torch.Tensor) else x
def pre(name):
    def hook(mod, args):
        if name not in seen: seen[name] = [tuple(clone(a) for a in args)]
    return hook
def post(name):
    def hook(mod, args, out):
        if len(seen[name]) == 1: seen[name].append(clone(out))
    return hook
l0 = d.layers[0]
mods = {"input_layernorm": l0.input_layernorm, "self_attn": l0.self_attn, "mlp": l0.mlp,
        "layer0": l0, "layer1": d.layers[1], "norm": d.norm, "lm_head": d.lm_head}
for n, m in mods.items():
    m.register_forward_pre_hook(pre(n)); m.register_forward_hook(post(n))
captured = {}
orig_rope = bb.rope_tables
def rope_spy(positions, *a):
    out = orig_rope(positions, *a); captured.setdefault("rope", (positions.clone(), a, out)); return out
bb.rope_tables = rope_spy
orig_sdpa = F.scaled_dot_product_attention
def sdpa_spy(q, k, v, **kw):
    out = orig_sdpa(q, k, v, **kw); captured.setdefault("sdpa", ((q.clone(), k, v), kw, out.clone())); return out
F.scaled_dot_product_attention = sdpa_spy
with torch.no_grad():
    step(cache.k.clone(), cache.v.clone(), *rounds[1].tensors())
bb.rope_tables = orig_rope
F.scaled_dot_product_attention = orig_sdpa

def report(name, got, want):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    parts = []
    for g, w in zip(got, want):
        diff = (g.float() - w.float()).abs()
        parts.append(f"{int((g != w).sum())}/{g.numel()} differ, max {diff.max().item():.3g}")
    print(f"{name:16s} " + "; ".join(parts), flush=True)

with torch.no_grad():
    positions, a, want = captured["rope"]
    torch._dynamo.reset()
    report("rope_tables", torch.compile(orig_rope, fullgraph=True)(positions, *a), want)
    (q, k, v), kw, want = captured["sdpa"]
    report("sdpa", torch.compile(orig_sdpa, fullgraph=True)(q, k, v, **kw), want)
    report("sdpa_eager_again", orig_sdpa(q, k, v, **kw), want)
    for n, m in mods.items():
        args, want = seen[n]
        args = tuple(clone(x) for x in args)
        torch._dynamo.reset()
        report(n, torch.compile(m, fullgraph=True, dynamic=False)(*args), want)
    x = seen["mlp"][0][0]
    report("silu", torch.compile(F.silu)(x), F.silu(x))
