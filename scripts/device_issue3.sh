#!/usr/bin/env bash
# On the H200 (device tool): inductor and aoti artifacts of both real lanes at buckets
# [1, 8, 64], each built, loaded and verified in fresh processes (scripts/artifact_times.py),
# and the test suite on CUDA for the tiny lanes, all in parallel. Writes to $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
for lane in qwen36_35b_a3b qwen36_27b; do
  for backend in inductor aoti; do
    timeout 540 python3 scripts/artifact_times.py --lane $lane --backends $backend \
      --buckets 1 8 64 --device cuda --root /tmp/artifacts \
      --out "$OUT/artifact_times_h200_${lane}_${backend}.json" > "/tmp/log_${lane}_${backend}.txt" 2>&1 &
  done
done
DSPARK_TEST_DEVICE=cuda timeout 540 python3 -m pytest tests -p no:cacheprovider -W ignore::DeprecationWarning \
  > "$OUT/tests_cuda.txt" 2>&1 &
wait
tail -n 2 "$OUT"/tests_cuda.txt
for f in /tmp/log_*.txt; do echo "== $f"; cat "$f"; done > "$OUT/logs.txt"
for f in /tmp/log_*.txt; do echo "== $f"; tail -n 3 "$f"; done
