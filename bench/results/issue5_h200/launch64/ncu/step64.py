"""Three rounds of the fused walk at a lane's shapes, greedy, for ncu to profile. From the
repository root: python3 bench/results/issue5_h200/launch64/ncu/step64.py qwen36_27b 64"""

import dataclasses
import sys
from types import SimpleNamespace

import torch

sys.path.insert(0, "scripts")
from markov_loop_bench import random_head  # noqa: E402

from dspark_compile.config import lane_config  # noqa: E402
from dspark_compile.draft import markov_loop  # noqa: E402

lane = lane_config(sys.argv[1])
R = int(sys.argv[2])
device = torch.device("cuda")
gen = torch.Generator(device=device).manual_seed(0)
head, d2t = random_head(lane, gen)
loop = SimpleNamespace(markov_head=head, d2t=d2t,
                       lane=dataclasses.replace(lane, fused_markov_step=True))
k, V = lane.k, lane.draft_vocab_size
inputs = dict(
    h=torch.zeros(R, k, lane.hidden_size, device=device, dtype=lane.torch_dtype),
    base_logits=torch.randn(R, k, V, device=device, dtype=lane.torch_dtype, generator=gen),
    anchor=torch.randint(0, lane.target_vocab_size, (R,), device=device, generator=gen),
    temperature=torch.zeros(R, device=device), seed=torch.arange(R, device=device) + 7,
    anchor_pos=torch.full((R,), 4096, device=device))
for _ in range(3):
    markov_loop(loop, **inputs, keep_logits=False)
torch.cuda.synchronize()
print("done")
