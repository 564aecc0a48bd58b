"""Speculative decoding with a drafter runtime: verification of drafted blocks against the
target, and the draft -> verify loop over a target's rows (continuous batching)."""

from dspark_compile.speculative.acceptance import verify_greedy, verify_rows, verify_sampling
from dspark_compile.speculative.drafting import DraftPolicy, MaxDraftRows, WhileDraftingPays
from dspark_compile.speculative.loop import decode
from dspark_compile.speculative.target import Target, pick_target_token
from dspark_compile.speculative.requests import Completion, Decoded, Request

__all__ = ["Completion", "Decoded", "DraftPolicy", "MaxDraftRows", "Request", "Target",
           "WhileDraftingPays", "decode", "pick_target_token", "verify_greedy", "verify_rows",
           "verify_sampling"]
