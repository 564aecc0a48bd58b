"""dspark-compile: DSpark drafters with the whole draft step on the device."""

import torch

# cuBLAS may otherwise reduce split-K bf16 GEMMs in bf16, by an algorithm that can differ
# between two call sites of one GEMM (eager vs compiled): token identity needs fp32 sums.
torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False

from dspark_compile.checkpoint import load_checkpoint, random_drafter, save_checkpoint
from dspark_compile.config import LaneConfig, lane_config
from dspark_compile.draft import DraftOutput, DraftStep, HostPath, KVCache, RoundInputs, draft
from dspark_compile.runtime import Runner, load_runner

__all__ = ["DraftOutput", "DraftStep", "HostPath", "KVCache", "LaneConfig", "RoundInputs",
           "Runner", "draft", "lane_config", "load_checkpoint", "load_runner", "random_drafter",
           "save_checkpoint"]
