#!/usr/bin/env bash
# On the H200 (device tool): inductor artifacts of both real lanes at buckets [1, 8, 64],
# built, loaded and verified in fresh processes (scripts/artifact_times.py), and the test
# suite on CUDA for the tiny lanes, in parallel. Writes to $OUT.
# AOTI is left out: on this image (torch 2.11.0+cu130) aoti_load_package segfaults in a
# fresh process even for a bare nn.Linear package (seen 2026-11-30).
set -uo pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
for lane in qwen36_35b_a3b qwen36_27b; do
  timeout 520 python3 scripts/artifact_times.py --lane $lane --backends inductor \
    --buckets 1 8 64 --device cuda --root /tmp/artifacts \
    --out "$OUT/artifact_times_h200_${lane}_inductor.json" > "/tmp/log_${lane}.txt" 2>&1 &
done
DSPARK_TEST_DEVICE=cuda timeout 520 python3 -m pytest tests -p no:cacheprovider -k "not aoti" \
  -W ignore::DeprecationWarning > "$OUT/tests_cuda.txt" 2>&1 &
wait
tail -n 3 "$OUT/tests_cuda.txt"
for f in /tmp/log_*.txt; do echo "== $f"; grep -v "^[WI][0-9]\{4\} " "$f"; done > "$OUT/logs.txt"
tail -n 30 "$OUT/logs.txt"
