#!/usr/bin/env bash
# On the H200 (device tool): the `real` sweep for one lane, sized to end inside one
# 10-minute call; the table, the per-job bench JSON and the log go to $OUT.
#   bash scripts/h200/sweep.sh qwen36_27b '[eager,inductor,aoti]' 4096,512
# Build the artifacts first, in a call of their own (scripts/h200/build.sh): a 27B job
# that finds them took about 230 s per context in the fifth session.
set -uo pipefail
export PYTHONUNBUFFERED=1
lane=${1:?lane} backends=${2:-[eager,inductor,aoti]} contexts=${3:-512,4096}
out=${OUT:?} sweep=/tmp/sweep_$lane
timeout "${SWEEP_TIMEOUT:-540}" python3 -c 'from dspark_compile.cli import sweep_main; sweep_main()' \
  -m sweep=real lane="$lane" "backends=$backends" context="$contexts" artifacts_dir=/tmp/arts \
  hydra.sweep.dir="$sweep" 2>&1 | tr '\r' '\n' | grep -v "it/s\|s/it\|^W1\|^ *$" \
  | tee "$out/sweep_$lane.log"
cp "$sweep"/results.csv "$out/results_$lane.csv"
cp "$sweep"/results.jsonl "$out/results_$lane.jsonl"
for job in "$sweep"/[0-9]*; do
  for file in "$job"/bench_*.json; do
    [ -f "$file" ] && cp "$file" "$out/$(basename "$file" .json)_job$(basename "$job").json"
  done
done
