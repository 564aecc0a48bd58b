#!/usr/bin/env bash
# On the H200 (device tool): the fused Markov step (issue 5) for one real lane. The loop
# alone (eager vs fused, other tilings too), the fused step's CUDA tests, then the round
# benchmark with lane.fused_markov_step=true (host path, eager device path and the captured
# eager runtime, all running the kernel). About 9 minutes for the 27B lane. Writes to $OUT.
#   bash scripts/device_fused.sh qwen36_27b
set -uo pipefail
export PYTHONUNBUFFERED=1
lane=${1:?lane}
timeout 150 python3 scripts/markov_loop_bench.py --lane "$lane" --launch 64x8 256x8 64x4 \
  --out "$OUT/loop_$lane.json" 2>&1 | grep -v Warning | tee "$OUT/loop_$lane.log"
DSPARK_TEST_DEVICE=cuda timeout 240 python3 -m pytest tests/test_fused_markov.py \
  -p no:cacheprovider -W ignore::DeprecationWarning > "$OUT/tests_cuda_fused.txt" 2>&1
echo "fused tests on cuda: exit $?"; tail -n 2 "$OUT/tests_cuda_fused.txt"
timeout "${BENCH_TIMEOUT:-170}" python3 -m dspark_compile.bench lane="$lane" \
  lane.fused_markov_step=true 'backends=[eager]' 'buckets=[1,8,64]' context=4096 \
  device=cuda repeats=10 warmup=2 artifacts_dir=/tmp/arts out_dir="$OUT" 2>&1 \
  | tr '\r' '\n' | grep -v "it/s\|s/it\|^ *$" | tee "$OUT/bench_${lane}_fused.log"
