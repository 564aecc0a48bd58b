#!/usr/bin/env bash
# On the H200 (device tool): the fused Markov step (issue 5). Its CUDA tests, then the
# benchmark of one real lane with lane.fused_markov_step=true (host path, eager device path,
# the captured eager runtime and inductor, all running the kernel). Writes to $OUT.
#   bash scripts/device_fused.sh qwen36_35b_a3b
set -uo pipefail
export PYTHONUNBUFFERED=1
lane=${1:?lane}
DSPARK_TEST_DEVICE=cuda timeout 240 python3 -m pytest tests/test_fused_markov.py \
  -p no:cacheprovider -W ignore::DeprecationWarning > "$OUT/tests_cuda_fused.txt" 2>&1
echo "fused tests on cuda: exit $?"; tail -n 2 "$OUT/tests_cuda_fused.txt"
timeout "${BENCH_TIMEOUT:-330}" python3 -m dspark_compile.bench lane="$lane" \
  lane.fused_markov_step=true 'backends=[eager,inductor]' 'buckets=[1,8,64]' context=4096 \
  device=cuda repeats=10 warmup=2 artifacts_dir=/tmp/arts out_dir="$OUT" 2>&1 \
  | tr '\r' '\n' | grep -v "it/s\|s/it\|^ *$" | tee "$OUT/bench_${lane}_fused.log"
