"""Does the host path give the same bits in every fresh process? Prints hashes."""
import hashlib, sys
import torch
from dspark_compile.bench import one_round
from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import lane_config
from dspark_compile.draft import KVCache
from dspark_compile.reference import HostPath

label, lane_name, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
if "emulate" in label:
    torch._inductor.config.emulate_precision_casts = True
lane = lane_config(lane_name, fused_markov_step=True, flex_attention=True)
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
d = random_drafter(lane, dev, 0)
def sha(t): return hashlib.sha256(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()).hexdigest()[:10]
prompt, decode = one_round(d, batch, int(sys.argv[4]), 0, dev)
cache = KVCache.allocate(lane, batch, dev, int(sys.argv[4]) + lane.k + 1)
host = HostPath(d)
host.draft(cache, prompt)
kp = sha(cache.k)
ref = host.draft(cache, decode)
with torch.no_grad():
    h, base = d(cache.k, cache.v, decode.anchor, decode.anchor_pos)
print(f"RESULT {label:12s} near_ties={int(ref.near_ties.sum())} ids={sha(ref.ids)} "
      f"conf={sha(ref.confidences)} kprompt={kp} h={sha(h)} base={sha(base)}", flush=True)
