#!/usr/bin/env bash
# On the H200 machine (device tool): a few seeded rounds of each real lane (random weights,
# context 4096), device path vs host path. The test suite on CUDA: scripts/h200/tests.sh.
# Expects the Hydra wheels installed from .whl/ (scripts/README.md); writes to $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__)" | tee -a "$OUT/gpu.txt"
for lane in qwen36_27b qwen36_35b_a3b; do
  echo "\$ python3 -m dspark_compile lane=$lane device=cuda batch=1 context=4096 rounds=5"
  python3 -m dspark_compile lane=$lane device=cuda batch=1 context=4096 rounds=5
done 2>&1 | tee "$OUT/real_lanes.txt"
