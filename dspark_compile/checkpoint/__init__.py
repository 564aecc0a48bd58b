"""Checkpoints: DeepSpec-native and speculators-format safetensors + config.json, and seeded
random weights for any lane."""

from dspark_compile.checkpoint.fields import describe_sources
from dspark_compile.checkpoint.formats import (CONFIG, Format, load_checkpoint, read_lane,
                                               save_checkpoint)
from dspark_compile.checkpoint.weights import (CHECKPOINT_WEIGHTS, cast_drafter, empty_drafter,
                                               load_weights, meta_drafter, random_drafter)

__all__ = ["CONFIG", "CHECKPOINT_WEIGHTS", "Format", "cast_drafter", "describe_sources",
           "empty_drafter", "load_checkpoint", "load_weights", "meta_drafter", "random_drafter",
           "read_lane", "save_checkpoint"]
