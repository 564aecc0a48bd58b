#!/usr/bin/env bash
# On the H200 (device tool): build the artifacts the `real` sweep and the benchmark reuse
# (both real lanes x eager, inductor, aoti at buckets [1,8,64], seed 0) into /tmp/arts, two
# builds at a time, before `scripts/h200/sweep.sh` in the next call on the same machine
# (within its idle release). Logs and build times go to $OUT.
#   bash scripts/h200/build.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
build() {
  for job in "$@"; do
    lane=${job%:*} backend=${job#*:}
    timeout 560 python3 -c '
import sys, time
from dspark_compile.compile import build_artifact
from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import lane_config
drafter = random_drafter(lane_config(sys.argv[1]), "cuda", seed=0)
start = time.perf_counter()
path, built = build_artifact(drafter, sys.argv[2], [1, 8, 64], "/tmp/arts")
print(path, "built" if built else "found", round(time.perf_counter() - start, 1), "s")
' "$lane" "$backend" > "$OUT/build_${lane}_$backend.log" 2>&1
    echo "$lane $backend: exit $?: $(tail -n 1 "$OUT/build_${lane}_$backend.log")"
  done
}
build qwen36_27b:eager qwen36_27b:aoti qwen36_35b_a3b:inductor &
build qwen36_35b_a3b:eager qwen36_27b:inductor qwen36_35b_a3b:aoti &
wait
