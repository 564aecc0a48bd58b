"""Host overhead of Runner.draft with the compiled step stubbed out (tiny lane, eager)."""
import cProfile, pstats, statistics, sys, time
import torch
from dspark_compile.artifacts import build_artifact
from dspark_compile.bench import one_round
from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import lane_config
from dspark_compile.runtime import load_runner

device = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cpu")
lane = lane_config("tiny")
drafter = random_drafter(lane, device)
path, _ = build_artifact(drafter, "eager", [1], "/tmp/ho_arts")
runner = load_runner(path, device)
slot = runner.admit()
prompt, decode = one_round(drafter, 1, 64, 0, device)
runner.draft(prompt, [slot])
with torch.no_grad():
    out = runner._calls[1]()
runner._calls[1] = lambda: out  # the step itself costs nothing now
for _ in range(200):
    runner.draft(decode, [slot])
times = []
for _ in range(2000):
    t = time.perf_counter(); runner.draft(decode, [slot]); times.append(time.perf_counter() - t)
print(f"draft host overhead: median {statistics.median(times)*1e6:.1f} us")
pr = cProfile.Profile(); pr.enable()
for _ in range(2000):
    runner.draft(decode, [slot])
pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(18)
if device.type == "cuda":
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        runner.draft(decode, [slot]); torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    print({n: names.count(n) for n in sorted(set(names)) if n.startswith("cuda")})
