#!/usr/bin/env bash
# Next step on the AOTI crash (no gdb on the H200 image): the native stack of the segfault
# in AOTIModelContainerRunnerCpu for a bare nn.Linear package, through segv_backtrace.c.
#   bash bench/results/issue3_h200/aoti_backtrace.sh     # ~1 min; prints the stack
set -uo pipefail
here=$(dirname "$0")
gcc -shared -fPIC -O0 -o /tmp/segv_backtrace.so "$here/segv_backtrace.c" || exit 1
python3 - <<'PY' || exit 1
import torch, torch._inductor, zipfile
m = torch.nn.Linear(8, 8); x = torch.randn(2, 8)
path = torch._inductor.aoti_compile_and_package(torch.export.export(m, (x,)),
                                                package_path="/tmp/lincpu.pt2")
zipfile.ZipFile(path).extractall("/tmp/lin_x")
PY
so=$(ls /tmp/lin_x/*/data/aotinductor/model/*.so | head -1)
cat > /tmp/run_runner.py <<PY
import torch
runner = torch._C._aoti.AOTIModelContainerRunnerCpu("$so", 1)
print("runner ok", runner.run([torch.randn(2, 8)])[0].shape)
PY
LD_PRELOAD=/tmp/segv_backtrace.so python3 /tmp/run_runner.py 2>&1 | grep -v Warning \
  | { command -v c++filt >/dev/null && c++filt || cat; }
