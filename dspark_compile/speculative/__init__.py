"""Speculative decoding with a drafter runtime: verification of drafted blocks against the
target, and a draft -> verify generation loop."""

from dspark_compile.speculative.acceptance import verify_greedy, verify_sampling
from dspark_compile.speculative.generate import Generation, generate, target_greedy

__all__ = ["Generation", "generate", "target_greedy", "verify_greedy", "verify_sampling"]
