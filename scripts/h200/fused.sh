#!/usr/bin/env bash
# On the H200 (device tool): the fused Markov walk (issue 5). The loop alone for each lane
# in $LANES at $BATCHES (eager vs fused at its own launch and at $LAUNCHES, columns x warps
# x programs per SM), greedy and mixed batches; with TESTS=1 also the fused walk's CUDA
# tests. Writes logs and JSON to $OUT (file names end in $TAG).
#   bash scripts/h200/fused.sh                 # both real lanes, about 3 minutes
#   LANES=qwen36_27b BATCHES=64 LAUNCHES="32x8x2 64x8x1" TAG=_b64 bash scripts/h200/fused.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
for lane in ${LANES:-qwen36_27b qwen36_35b_a3b}; do
  # shellcheck disable=SC2086  # the launches split on purpose
  timeout "${LOOP_TIMEOUT:-280}" python3 scripts/markov_loop_bench.py --lane "$lane" \
    --batches ${BATCHES:-1 8 64} --launch ${LAUNCHES:-} \
    --out "$OUT/loop_$lane${TAG:-}.json" 2>&1 | grep -v Warning | tee "$OUT/loop_$lane${TAG:-}.log"
done
if [ "${TESTS:-0}" = 1 ]; then
  DSPARK_TEST_DEVICE=cuda timeout 300 python3 -m pytest tests/kernels/test_markov_walk.py \
    -p no:cacheprovider -W ignore::DeprecationWarning > "$OUT/tests_cuda_fused.txt" 2>&1
  echo "fused tests on cuda: exit $?"; tail -n 2 "$OUT/tests_cuda_fused.txt"
fi
