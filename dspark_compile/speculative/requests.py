"""What a caller hands the loop (requests) and what it gets back (each request's completion,
and the run's times)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Request:
    prompt: list[int]
    max_new_tokens: int
    seed: int = 0  # keys the request's noise, with each token's position


@dataclass
class Completion:
    tokens: list[int] = field(default_factory=list)  # the new tokens
    accepted: list[int] = field(default_factory=list)  # drafts accepted, per round
    verified: list[int] = field(default_factory=list)  # drafts verified, per round
    confidences: list[list[float]] = field(default_factory=list)  # the drafter's, per round


@dataclass
class Decoded:
    completions: list[Completion]  # in the order of the requests
    seconds: float
    draft_seconds: float  # on the device's stream
    verify_seconds: float
    prefill_seconds: float  # the target's prefills of the prompts
    passes: int  # the target's verification passes (one a round of the rows)
    # while every row served a request (until the queue ran dry, rows waiting for a refill
    # included; 0 where it never held more requests than rows): the tokens made and their
    # time, from the start to the end of the last pass launched before the queue ran dry,
    # on the device's stream
    busy_tokens: int = 0
    busy_seconds: float = 0.0
    # on the device's stream, from each drafted round's draft to its verification: the
    # host's turn (the draft's download and check, the pass's launch), where the device
    # waits but for the drafted ids' copy up
    handoff_seconds: float = 0.0
