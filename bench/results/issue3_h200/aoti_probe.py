import subprocess, sys
BUILD = """
import torch, torch._inductor
m = torch.nn.Linear(8, 8).cuda(); x = torch.randn(2, 8, device="cuda")
ep = torch.export.export(m, (x,))
print("compiling", flush=True)
path = torch._inductor.aoti_compile_and_package(ep, package_path="/tmp/lin.pt2")
print("compiled", path, flush=True)
"""
LOAD = "import torch, torch._inductor; torch.zeros(1, device='cuda'); print('loading', flush=True); r = torch._inductor.aoti_load_package('/tmp/lin.pt2'); print('loaded', flush=True); print('ok', r(torch.randn(2, 8, device='cuda')).shape, flush=True)"
CPU = """
import torch, torch._inductor
m = torch.nn.Linear(8, 8); x = torch.randn(2, 8)
ep = torch.export.export(m, (x,))
path = torch._inductor.aoti_compile_and_package(ep, package_path="/tmp/lincpu.pt2")
r = torch._inductor.aoti_load_package(path); print("cpu ok", r(x).shape, flush=True)
"""
for name, code in [("build", BUILD), ("load", LOAD), ("cpu", CPU)]:
    p = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True)
    err = "\n".join(l for l in p.stderr.splitlines() if "Warning" not in l and "warn" not in l)
    print("==", name, "exit", p.returncode, p.stdout.strip()[-500:], "\n", err[-2500:], flush=True)
