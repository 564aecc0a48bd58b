"""The draft step: its inputs and their rules, sampling, the Markov walk, the step every
backend compiles, and the host path that is its oracle."""

from dspark_compile.draft.checks import check_round
from dspark_compile.draft.host import HostPath, HostResult
from dspark_compile.draft.inputs import DraftOutput, KVCache, RoundInputs
from dspark_compile.draft.step import DraftStep, PrefillStep, draft

__all__ = ["DraftOutput", "DraftStep", "HostPath", "HostResult", "KVCache", "PrefillStep",
           "RoundInputs", "check_round", "draft"]
