#!/usr/bin/env bash
# On the H200 (device tool, carry [".whl"]): a real lane's artifacts, then their check,
# benchmark or cold start, in back-to-back calls on one warm machine (artifacts in /tmp/arts;
# the background builds outlive a call while the machine stays warm). Writes to $OUT.
#   bash scripts/h200/lane.sh build LANE [BACKEND...]  # its builds start (default: inductor
#                                               # and aoti, buckets 1 8 64, random weights)
#   bash scripts/h200/lane.sh verify LANE       # dspark-verify of its inductor and aoti
#                                               # artifacts: prompts of 2049-4096 rows
#   bash scripts/h200/lane.sh bench LANE        # dspark-bench: eager, inductor, aoti at
#                                               # buckets 1 8 64, context 4096
#   bash scripts/h200/lane.sh cold LANE [BACKEND...]   # scripts/artifact_times.py: the
#                                               # backends built (default: aoti, inductor),
#                                               # with torch's bytecode compiled first (the
#                                               # image ships none; a pip install does)
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/builds

build() {  # in a session of its own: it goes on after this call returns
  local lane=$1 backends=("${@:2}")
  [ $# -gt 1 ] || backends=(inductor aoti)
  for backend in "${backends[@]}"; do
    setsid nohup timeout 900 python3 -c '
import sys, time
from dspark_compile.compile import build_artifact
from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import lane_config
drafter = random_drafter(lane_config(sys.argv[1]), "cuda", seed=0)
start = time.perf_counter()
path, built = build_artifact(drafter, sys.argv[2], [1, 8, 64], "/tmp/arts")
print(path, "built" if built else "found", round(time.perf_counter() - start, 1), "s")
' "$lane" "$backend" > "/tmp/builds/${lane}_$backend.log" 2>&1 < /dev/null &
    echo $! > "/tmp/builds/${lane}_$backend.pid"
  done
}

wait_builds() {
  for pid in /tmp/builds/"$1"_*.pid; do
    while kill -0 "$(cat "$pid")" 2> /dev/null; do sleep 5; done
  done
  for log in /tmp/builds/"$1"_*.log; do echo "$log: $(tail -n 1 "$log")"; cp "$log" "$OUT/"; done
}

artifact() { grep -E '^/tmp/arts/.* (built|found) ' "/tmp/builds/$1_$2.log" | cut -d' ' -f1; }

case ${1:?build LANE, verify LANE, bench LANE or cold LANE} in
  build) build "${@:2}" ;;
  verify)
    wait_builds "$2"
    for backend in inductor aoti; do
      timeout 270 python3 -m dspark_compile verify "artifact=$(artifact "$2" $backend)" \
        device=cuda context=4096 rounds=4 temperature=1.0 > "$OUT/verify_$2_$backend.json"
      echo "$backend: exit $? $(cut -c1-300 "$OUT/verify_$2_$backend.json")"
    done ;;
  bench)
    wait_builds "$2"
    timeout 540 python3 -c 'from dspark_compile.cli import bench_main; bench_main()' \
      lane="$2" 'backends=[eager,inductor,aoti]' 'buckets=[1,8,64]' context=4096 \
      device=cuda repeats=10 warmup=2 artifacts_dir=/tmp/arts out_dir="$OUT" ;;
  cold)
    wait_builds "$2"
    export PYTHONPYCACHEPREFIX=/tmp/pycache
    site=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
    timeout 200 python3 -m compileall -q -j 16 "$site" > /dev/null 2>&1
    echo "bytecode: $(find /tmp/pycache -name '*.pyc' | wc -l) files"
    backends=("${@:3}")
    [ $# -gt 2 ] || backends=(aoti inductor)
    timeout 540 python3 scripts/artifact_times.py --lane "$2" --backends "${backends[@]}" \
      --buckets 1 8 64 --device cuda --root /tmp/arts --out "$OUT/cold_$2.json" ;;
esac
