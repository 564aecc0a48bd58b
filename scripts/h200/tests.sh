#!/usr/bin/env bash
# On the H200 (device tool): the test suite on CUDA (tiny lanes), in two shards that each
# are meant to end inside one 10-minute call each. Writes tests_cuda_<shard>.txt
# to $OUT.
#   bash scripts/h200/tests.sh 1   # draft step, model, kernels, checkpoints, runtime, the rest
#   bash scripts/h200/tests.sh 2   # backends, the store, the tools, the C++ runtime, scripts
# Together they run every test directory.
set -uo pipefail
case ${1:?shard: 1 or 2} in
  1) files="tests/draft tests/model tests/kernels tests/checkpoint tests/speculative
            tests/runtime $(ls tests/test_*.py)" ;;
  2) files="tests/compile tests/tools tests/cpp tests/scripts" ;;
  *) echo "shard must be 1 or 2" >&2; exit 2 ;;
esac
# shellcheck disable=SC2086  # the file list splits on purpose
DSPARK_TEST_DEVICE=cuda timeout "${TESTS_TIMEOUT:-560}" python3 -m pytest $files \
  -p no:cacheprovider -W ignore::DeprecationWarning --durations=15 \
  > "$OUT/tests_cuda_$1.txt" 2>&1
echo "pytest shard $1 on cuda: exit $?"
tail -n 3 "$OUT/tests_cuda_$1.txt"
