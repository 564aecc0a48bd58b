"""The testbed's baseline arm: the target generating alone, one pass a token, in groups that
run until their longest request ends, or through fixed rows refilled as requests end
(``baseline``: either, as ``e2e.py`` runs it)."""

from __future__ import annotations

import time
from collections import deque
from typing import Optional

import torch

from dspark_compile.runtime.marks import StreamMark
from dspark_compile.runtime.transfer import upload
from dspark_compile.speculative import pick_target_token
from dspark_compile.speculative.refill import Refills
from llama import StaticLlama, captured


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def cache_slots(prompts: list[list[int]], new_tokens: int, k: int) -> int:
    """The target's cache in both arms: a speculative row may overshoot its tokens by k and
    runs on two rounds before the loop knows it is done (then it stays where it is)."""
    return max(map(len, prompts)) + new_tokens + 2 * (k + 1)


def target_alone(model, prompts, new_tokens: list[int], temperature: float, graphs: bool,
                 taps, slots: int, device, margins: bool = False
                 ) -> tuple[list[list[int]], Optional[list[list[float]]], float]:
    """Plain generation, one target pass per token, ``new_tokens[row]`` tokens a row (the
    batch runs until its longest is done). Returns the new tokens, with ``margins`` the gap
    between the best two logits at each of them (else None: not in a timed run), and the
    seconds."""
    B = len(prompts)
    llama = StaticLlama(model, B, slots, taps)
    step = captured(llama, B, 1) if graphs else llama.forward
    seed = torch.arange(B, device=device)
    sync()
    start = time.perf_counter()
    last, _, position = llama.prefill(prompts)
    out, gaps = [], []
    for _ in range(max(new_tokens)):
        token = pick_target_token(last, temperature, seed, position)
        out.append(token)
        if margins:
            best = last.topk(2).values
            gaps.append(best[:, 0] - best[:, 1])
        logits, _ = step(token[:, None], position)
        last, position = logits[:, 0], position + 1
    sync()
    seconds = time.perf_counter() - start
    tokens = [t[:n] for t, n in zip(torch.stack(out, 1).tolist(), new_tokens)]
    if not margins:
        return tokens, None, seconds
    return tokens, [g[:n] for g, n in zip(torch.stack(gaps, 1).tolist(), new_tokens)], seconds


def target_alone_refilled(model, prompts, new_tokens: list[int], temperature: float,
                          graphs: bool, taps, slots: int, device, rows: int,
                          refill_wait: float = 0.0
                          ) -> tuple[list[list[int]], float, tuple[int, float], float]:
    """Plain generation through ``rows`` rows, a finished request's row taking the next
    prompt at once (continuous batching; ``refill_wait`` as ``decode``'s), request ``i``
    seeded ``i``. The lengths are known ahead, so the host refills rows without reading a
    token back. Returns the new tokens, the seconds, the tokens and seconds while every row
    served a request (as the loop's ``Decoded.busy_tokens``: up to the last step before
    the queue ran dry), and the prompts' prefills' seconds on the device's stream (as
    ``Decoded.prefill_seconds``)."""
    llama = StaticLlama(model, rows, slots, taps)
    step = captured(llama, rows, 1) if graphs else llama.forward
    queue, serving, left = deque(range(len(prompts))), [None] * rows, [0] * rows
    last = torch.zeros(rows, model.config.vocab_size, device=device)
    position = torch.zeros(rows, dtype=torch.long, device=device)
    seed, active = torch.zeros_like(position), torch.zeros(rows, dtype=torch.bool, device=device)
    made = []  # per step: the tokens, and the request each row served
    refills = Refills(rows, refill_wait)
    prefills: list[tuple[StreamMark, StreamMark]] = []

    def refill(free: list[int]) -> None:
        chosen = [queue.popleft() for _ in free]
        begin = StreamMark(device)
        logits, _, lengths = llama.prefill([prompts[i] for i in chosen], free)
        prefills.append((begin, StreamMark(device)))
        index = upload(free, device)
        last[index], position[index] = logits, lengths
        seed[index], active[index] = upload(chosen, device), True
        for row, request in zip(free, chosen):
            serving[row], left[row] = request, new_tokens[request]

    sync()
    start, first = time.perf_counter(), StreamMark(device)
    drained: Optional[tuple[int, StreamMark]] = None  # steps, and their end, when it ran dry
    refill(list(range(min(rows, len(queue)))))
    while any(request is not None for request in serving):
        token = pick_target_token(last, temperature, seed, position)
        made.append((token, list(serving)))
        ended = [r for r in range(rows) if serving[r] is not None and left[r] == 1]
        for row in range(rows):
            left[row] -= serving[row] is not None
        logits, _ = step(token[:, None], position)
        last, position = logits[:, 0].clone(), position + active
        for row in ended:
            serving[row] = None
        if ended:
            active.index_fill_(0, upload(ended, device), False)
        refills.free(ended, len(made))
        chosen = refills.due(len(made), sum(r is not None for r in serving), len(queue))
        if chosen:
            if len(chosen) >= len(queue) and drained is None:
                drained = (len(made), StreamMark(device))
            refill(chosen)
    sync()
    seconds = time.perf_counter() - start
    tokens: list[list[int]] = [[] for _ in prompts]
    for values, requests in zip(torch.stack([t for t, _ in made]).tolist(), (r for _, r in made)):
        for value, request in zip(values, requests):
            if request is not None:
                tokens[request].append(value)
    busy = (0, 0.0) if drained is None else (
        sum(request is not None for _, requests in made[:drained[0]] for request in requests),
        first.seconds_to(drained[1]))
    return tokens, seconds, busy, sum(b.seconds_to(e) for b, e in prefills)


def groups(count: int, batch: int, refill: bool) -> list[slice]:
    """The requests each run takes: all through ``batch`` refilled rows, or groups of
    ``batch`` that each run until their longest request ends."""
    return [slice(0, count)] if refill else [slice(i, i + batch)
                                             for i in range(0, count - batch + 1, batch)]


# the target alone's run: tokens, seconds, (tokens, seconds) while every row served a
# request, and its prefills' seconds (None: not timed)
Alone = tuple[list[list[int]], float, tuple[int, float], Optional[float]]


def baseline(model, prompts, wanted: list[int], batch: int, temperature: float, graphs: bool,
             taps, slots: int, device, refill: bool = False, refill_wait: float = 0.0
             ) -> Alone:
    """The target alone over the requests, ``batch`` at a time: its tokens, its seconds, and
    (refilled, ``refill_wait`` as decode's) the tokens and seconds while every row served a
    request and its prefills' seconds."""
    if refill:
        return target_alone_refilled(model, prompts, wanted, temperature, graphs, taps, slots,
                                     device, batch, refill_wait)
    tokens, seconds = [], 0.0
    for group in groups(len(prompts), batch, refill):
        made, _, took = target_alone(model, prompts[group], wanted[group], temperature,
                                     graphs, taps, slots, device)
        tokens, seconds = tokens + made, seconds + took
    return tokens, seconds, (0, 0.0), None
