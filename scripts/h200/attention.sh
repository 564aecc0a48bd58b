#!/usr/bin/env bash
# On the H200 (device tool, carry [".whl"]): the block's attention kernel on the real lanes,
# in back-to-back calls on one warm machine (artifacts in /tmp/arts and the background
# builds outlive a call while the machine stays warm). Writes to $OUT.
#   bash scripts/h200/attention.sh check        # 35B-A3B builds start; CUDA tests of the
#                                               # kernel; its micro-benchmark; 27B builds start
#   bash scripts/h200/attention.sh bench LANE   # dspark-bench: eager, inductor, aoti at
#                                               # buckets 1 8 64, context 4096
#   bash scripts/h200/attention.sh cold LANE    # scripts/artifact_times.py: aoti, inductor
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/builds

build() {  # in a session of its own: it goes on after this call returns
  for backend in inductor aoti; do
    setsid nohup timeout 900 python3 -c '
import sys, time
from dspark_compile.compile import build_artifact
from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import lane_config
drafter = random_drafter(lane_config(sys.argv[1]), "cuda", seed=0)
start = time.perf_counter()
path, built = build_artifact(drafter, sys.argv[2], [1, 8, 64], "/tmp/arts")
print(path, "built" if built else "found", round(time.perf_counter() - start, 1), "s")
' "$1" "$backend" > "/tmp/builds/$1_$backend.log" 2>&1 < /dev/null &
  done
}

wait_builds() {
  while pgrep -f "build_artifact" > /dev/null; do sleep 5; done
  for log in /tmp/builds/"$1"_*.log; do echo "$log: $(tail -n 1 "$log")"; cp "$log" "$OUT/"; done
}

case ${1:?check, bench LANE or cold LANE} in
  check)
    build qwen36_35b_a3b
    DSPARK_TEST_DEVICE=cuda timeout 330 python3 -m pytest -q -p no:cacheprovider \
      tests/kernels/test_block_attention.py tests/model/test_backbone.py \
      tests/draft/test_step.py tests/compile/test_backends.py -k \
      "attention or recompute or compiles or host" > "$OUT/tests_cuda.txt" 2>&1
    echo "pytest on cuda: exit $?"; tail -n 3 "$OUT/tests_cuda.txt"
    timeout 200 python3 scripts/attention_bench.py --out "$OUT/attention.json" \
      --launch 128x32x64x8x2 512x32x64x8x2 256x16x64x8x2 128x64x64x4x3 512x64x64x4x3 \
      256x64x64x8x3
    build qwen36_27b ;;
  bench)
    wait_builds "$2"
    timeout 540 python3 -c 'from dspark_compile.cli import bench_main; bench_main()' \
      lane="$2" 'backends=[eager,inductor,aoti]' 'buckets=[1,8,64]' context=4096 \
      device=cuda repeats=10 warmup=2 artifacts_dir=/tmp/arts out_dir="$OUT" ;;
  cold)
    wait_builds "$2"
    timeout 540 python3 scripts/artifact_times.py --lane "$2" --backends aoti inductor \
      --buckets 1 8 64 --device cuda --root /tmp/arts --out "$OUT/cold_$2.json" ;;
esac
