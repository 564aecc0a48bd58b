"""dspark-compile: DSpark drafters with the whole draft step on the device."""

from dspark_compile.checkpoint import load_checkpoint, random_drafter, save_checkpoint
from dspark_compile.config import LaneConfig, lane_config
from dspark_compile.draft import DraftOutput, DraftStep, HostPath, KVCache, RoundInputs, draft
from dspark_compile.runtime import Runner, load_runner

__all__ = ["DraftOutput", "DraftStep", "HostPath", "KVCache", "LaneConfig", "RoundInputs",
           "Runner", "draft", "lane_config", "load_checkpoint", "load_runner", "random_drafter",
           "save_checkpoint"]
