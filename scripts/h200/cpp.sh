#!/usr/bin/env bash
# On the H200 machine (device tool): the C++ runtime against the Python runner on a real
# lane's aoti artifact (scripts/cpp_runner_check.py). Steps, one per device call while the
# machine stays warm (build/ and artifacts/ persist between calls):
#   scripts/h200/cpp.sh build           # the C++ runtime, Release, against this torch
#   scripts/h200/cpp.sh artifact LANE   # LANE's aoti artifact, buckets 1 8 64, random weights
#   scripts/h200/cpp.sh check LANE      # the comparison; JSON and table to $OUT
# Expects .whl/ (the Hydra and nlohmann_json wheels; the image has CMake and OpenSSL's headers).
set -euo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || true
export PYTHONPATH=/tmp/site:$PWD
case "$1" in
  build)
    cmake -S cpp -B build/cpp -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')" \
      -DNLOHMANN_JSON_INCLUDE_DIR=/tmp/site/nlohmann_json/include > "$OUT/cmake.txt" 2>&1 \
      || { tail -40 "$OUT/cmake.txt"; exit 1; }
    cmake --build build/cpp -j 16 2>&1 | tail -5
    ;;
  artifact)
    python3 - "$2" <<'PY'
import sys, time
from dspark_compile.checkpoint import random_drafter
from dspark_compile.compile import build_artifact
from dspark_compile.config import lane_config
drafter = random_drafter(lane_config(sys.argv[1]), "cuda", seed=0)
start = time.perf_counter()
path, built = build_artifact(drafter, "aoti", [1, 8, 64], "artifacts")
print(path, "built" if built else "reused", f"{time.perf_counter() - start:.1f} s")
open(f"artifacts/{sys.argv[1]}.path", "w").write(str(path))
PY
    ;;
  check)
    python3 scripts/cpp_runner_check.py "$(cat artifacts/$2.path)" --tool build/cpp/dspark-draft-cpp \
      --device cuda --context 4096 --out "$OUT/cpp_check_$2.json"
    ;;
esac
