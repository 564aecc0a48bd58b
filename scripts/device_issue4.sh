#!/usr/bin/env bash
# On the H200 (device tool): the issue-4 benchmark, one lane per call so each call ends
# inside the 10-minute limit, nothing else on the GPU while it times. Writes to $OUT.
#   bash scripts/device_issue4.sh qwen36_27b      # ~6 min: two artifacts of 8.8 GB weights
#   bash scripts/device_issue4.sh qwen36_35b_a3b  # ~3 min
# Then the 35B inductor artifact it built, verified in a fresh process:
#   python3 -m dspark_compile.verify artifact=$(ls -d /tmp/arts/qwen36_35b_a3b-*/inductor/1-8-64) device=cuda
set -uo pipefail
export PYTHONUNBUFFERED=1
lane=${1:?lane}
timeout 560 python3 -m dspark_compile.bench lane="$lane" 'backends=[eager,inductor]' \
  'buckets=[1,8,64]' context=4096 device=cuda repeats=10 warmup=2 out_dir="$OUT" \
  artifacts_dir=/tmp/arts 2>&1 | tr '\r' '\n' | grep -v "^W1\|it/s\|s/it\|^ *$" \
  | tee "$OUT/bench_${lane}.log"
