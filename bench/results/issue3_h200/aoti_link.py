"""Why the image's AOTI wrapper.so crashes: how it is linked, and one candidate fix."""
import glob, os, subprocess, sys, zipfile
import torch, torch._inductor
from torch._inductor import config, cpp_builder

def sh(cmd):
    print("$", cmd); print(subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip())

sh("g++ -print-file-name=libstdc++.so; ls -la $(g++ -print-file-name=libstdc++.so); g++ -print-file-name=libstdc++.a")
sh("ls -la /usr/lib/gcc/x86_64-linux-gnu/*/libstdc++* 2>&1")
tdir = os.path.dirname(torch._inductor.__file__)
sh(f"grep -rn 'static-libstdc\\|Bstatic\\|static-libgcc' {tdir}/*.py | head")
print("cpp compiler:", cpp_builder.get_cpp_compiler())
original = cpp_builder.CppBuilder.build
def build(self):
    cmd = self.get_command_line()
    if ".wrapper.o " in cmd: print("LINK CMD:", cmd[:150], "...", cmd[-1500:])
    return original(self)
cpp_builder.CppBuilder.build = build

def package(name, device="cpu", **opts):
    m = torch.nn.Linear(8, 8).to(device); x = torch.randn(2, 8, device=device)
    with config.patch(opts):
        path = torch._inductor.aoti_compile_and_package(torch.export.export(m, (x,)), package_path=f"/tmp/{name}.pt2")
    zipfile.ZipFile(path).extractall(f"/tmp/{name}_x")
    so = glob.glob(f"/tmp/{name}_x/*/data/aotinductor/model/*.so")[0]
    sh(f"readelf -d {so} | grep NEEDED; nm -C {so} | grep -c 'codecvt'")
    r = subprocess.run([sys.executable, "-c", f"import torch, torch._inductor as i; m = i.aoti_load_package('{path}'); print('LOAD OK', m(torch.randn(2, 8, device=\'{device}\')).shape)"],
                       capture_output=True, text=True)
    print(name, "fresh load rc", r.returncode, r.stdout.strip()[-200:], r.stderr.strip()[-300:])

package("plain")
package("dynstdcxx", **{"aot_inductor.custom_op_libs": [":libstdc++.so.6"]})
if torch.cuda.is_available():
    package("cudafix", "cuda", **{"aot_inductor.custom_op_libs": [":libstdc++.so.6"]})
