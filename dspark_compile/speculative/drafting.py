"""Whether a round drafts. A round that does not is the target's own step: no draft, one
token a request, a pass one token wide. Drafting pays only while its rounds make more tokens
a second than such steps would; with many rows or a high temperature they may not, and
then :func:`~dspark_compile.speculative.decode` runs own steps for the rounds a policy
here declines."""

from __future__ import annotations

from typing import Optional, Protocol

import torch

from dspark_compile.errors import ConfigError
from dspark_compile.runtime.schedule import StepsPerSecond


class DraftPolicy(Protocol):
    def drafts(self, live: int) -> bool:
        """Whether the next round, of ``live`` requests, drafts."""

    def observe(self, tokens: float, width: int) -> None:
        """A drafted round's outcome: the tokens it made a request (accepted drafts + 1,
        averaged) and its pass's width (tokens a row)."""


class MaxDraftRows:
    """Rounds of more than ``rows`` requests are the target's own steps: for an engine whose
    step costs what its tokens do, where a batch above some size never gains from drafts."""

    def __init__(self, rows: int):
        if rows < 0:
            raise ConfigError(f"MaxDraftRows({rows}): expected 0 or more rows")
        self.rows = rows

    def drafts(self, live: int) -> bool:
        return live <= self.rows

    def observe(self, tokens: float, width: int) -> None:
        pass


class WhileDraftingPays:
    """Drafts while a drafted round's tokens a second beat the target's own steps': tokens a
    request a round (the drafted rounds so far, exponentially weighted, ``weight`` for the
    newest) times ``rounds`` at the round's pass width (the round's rate: the target's
    profiled steps a second by width, with the time outside the pass added,
    :meth:`StepsPerSecond.with_overhead`), against ``own``, the target's one-token steps a
    second as the loop runs them (the pass, and the round's work around it but a draft).
    Until a round has drafted it drafts. While drafting does not pay, one round in
    ``explore`` drafts all the same: acceptance moves with the text. The averages run over
    passes, not drafted rounds: a round seen ``n`` passes after the last weighs
    ``1 - (1 - weight)^n``, so an exploring round counts for the own steps before it, and a
    light ``weight`` keeps one unlucky round among drafted ones from stopping the drafts."""

    def __init__(self, rounds: StepsPerSecond, own: float, explore: int = 16,
                 weight: float = 0.05):
        if rounds.by != "width":
            raise ConfigError("WhileDraftingPays: rounds must be charged by width (a row's "
                              "tokens), StepsPerSecond(..., by='width')")
        if own <= 0 or explore < 1 or not 0 < weight <= 1:
            raise ConfigError(f"WhileDraftingPays: own={own} must be > 0, explore={explore} "
                              f">= 1 and weight={weight} in (0, 1]")
        self.rounds, self.own, self.explore, self.weight = rounds, own, explore, weight
        self.tokens: Optional[float] = None  # a request's, a drafted round (averaged)
        self.rate: Optional[float] = None  # drafted rounds a second at their widths
        self.declined = 0  # rounds since the last that drafted
        self.passes = 0  # rounds, drafted or not, since the last observed
        self.width_rates: dict[int, float] = {}  # ``rounds`` at each width seen

    def pays(self) -> bool:
        return self.tokens is None or self.tokens * self.rate >= self.own

    def drafts(self, live: int) -> bool:
        self.passes += 1
        if self.pays() or self.declined + 1 >= self.explore:
            self.declined = 0
            return True
        self.declined += 1
        return False

    def observe(self, tokens: float, width: int) -> None:
        if width not in self.width_rates:
            self.width_rates[width] = float(self.rounds(torch.tensor(width)))
        rate = self.width_rates[width]
        weight, self.passes = 1 - (1 - self.weight) ** max(1, self.passes), 0
        if self.tokens is None:
            self.tokens, self.rate = tokens, rate
        else:
            self.tokens += weight * (tokens - self.tokens)
            self.rate += weight * (rate - self.rate)
