#!/usr/bin/env bash
# The same dspark-bench command on several versions of the code, in one device call, so
# their timings and identity are compared within one run. Here, before the call:
#   bash scripts/device_ab.sh --prepare main in-graph-checks     # git archive into ab/<ref>
# Then on the H200 (device tool, carry [".whl", "ab"]), each version in turn, ROUNDS times:
#   ROUNDS=2 bash scripts/device_ab.sh lane=qwen36_35b_a3b lane.fused_markov_step=true \
#     lane.flex_attention=true 'backends=[inductor]' 'buckets=[1]' context=4096 device=cuda
# Each run writes $OUT/<ref>_<round>/bench_*.json and a log; the table rows print last.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [ "${1:-}" = "--prepare" ]; then
  shift
  for ref in "$@"; do
    rm -rf "$root/ab/$ref" && mkdir -p "$root/ab/$ref"
    git -C "$root" archive "$ref" dspark_compile conf | tar -x -C "$root/ab/$ref"
    echo "ab/$ref: $(git -C "$root" rev-parse --short "$ref")"
  done
  exit 0
fi
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  "$root"/.whl/*.whl 2>/dev/null
for round in $(seq 1 "${ROUNDS:-1}"); do
  for tree in "$root"/ab/*/; do
    name=$(basename "$tree")_$round
    (cd "$tree" && PYTHONPATH=/tmp/site:$tree timeout "${AB_TIMEOUT:-280}" \
      python3 -m dspark_compile.bench "$@" artifacts_dir=/tmp/arts out_dir="$OUT/$name" \
      > "$OUT/$name.log" 2>&1)
    echo "== $name: exit $?"
    tr '\r' '\n' < "$OUT/$name.log" | grep -E "^(lane|qwen|tiny)" | grep -v "backends"
  done
done
