set -x
command -v gdb catchsegv g++ gcc; g++ --version | head -1
python3 - <<'PY'
import torch, torch._inductor, zipfile
m = torch.nn.Linear(8, 8); x = torch.randn(2, 8)
ep = torch.export.export(m, (x,))
p = torch._inductor.aoti_compile_and_package(ep, package_path="/tmp/lincpu.pt2")
zipfile.ZipFile(p).extractall("/tmp/lin_x")
print(torch._C._GLIBCXX_USE_CXX11_ABI, torch.__config__.show()[:1500])
PY
so=$(ls /tmp/lin_x/*/data/aotinductor/model/*.so | head -1)
ldd "$so"
cat > /tmp/run.py <<PY
import torch
r = torch._C._aoti.AOTIModelContainerRunnerCpu("$so", 1)
print("runner ok", r.run([torch.randn(2, 8)])[0].shape)
PY
if command -v gdb; then gdb -q -batch -ex run -ex bt -ex "info sharedlibrary" --args python3 /tmp/run.py 2>&1 | grep -v "^\[New\|^\[Thread" | head -80
else python3 -X faulthandler /tmp/run.py; fi
ls /tmp/lin_x/*/data/aotinductor/model/
