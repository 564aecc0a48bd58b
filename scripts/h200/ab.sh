#!/usr/bin/env bash
# The same dspark-bench command on several versions of the code, in one device call, so
# their timings and identity are compared within one run. Here, before the call:
#   bash scripts/h200/ab.sh --prepare main in-graph-checks     # git archive into ab/<ref>
# Then on the H200 (device tool, carry [".whl", "ab"]), each version in turn, ROUNDS times:
#   ROUNDS=2 bash scripts/h200/ab.sh lane=qwen36_35b_a3b lane.fused_markov_step=true \
#     lane.fused_attention=true 'backends=[inductor]' 'buckets=[1]' context=4096 device=cuda
# Each run writes <ref>_<round>/bench_*.json and a log, packed into $OUT/ab.tar.gz (the
# device tool brings back at most 8 files); the table rows print as they finish.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
if [ "${1:-}" = "--prepare" ]; then
  shift
  for ref in "$@"; do
    rm -rf "$root/ab/$ref" && mkdir -p "$root/ab/$ref"
    git -C "$root" archive "$ref" dspark_compile | tar -x -C "$root/ab/$ref"
    echo "ab/$ref: $(git -C "$root" rev-parse --short "$ref")"
  done
  exit 0
fi
export PYTHONUNBUFFERED=1
runs=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  "$root"/.whl/*.whl 2>/dev/null
for round in $(seq 1 "${ROUNDS:-1}"); do
  for tree in "$root"/ab/*/; do
    name=$(basename "$tree")_$round
    (cd "$tree" && PYTHONPATH=/tmp/site:$tree timeout "${AB_TIMEOUT:-280}" \
      python3 -c 'from dspark_compile.cli import bench_main; bench_main()' "$@" artifacts_dir=/tmp/arts out_dir="$runs/$name" \
      > "$runs/$name.log" 2>&1)
    echo "== $name: exit $?"
    tr '\r' '\n' < "$runs/$name.log" | grep -E "^(lane|qwen|tiny)" | grep -v "backends"
  done
done
tar -czf "$OUT/ab.tar.gz" -C "$runs" .
