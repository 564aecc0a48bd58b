"""Speculative decoding with a drafter runtime: draft -> verify rounds over the fixed rows of
a target, each row serving one request at a time and refilled from the queue as soon as
its request is done (continuous batching).

The target is whatever implements :class:`Target` (an engine's model runner; the
testbed's static-cache Llama is one). Greedy verification keeps the target's own greedy
output; sampled verification (``temperature > 0``, an artifact built ``with_probs``) keeps
its distribution. One host synchronisation a round, the runner's own: when a round's ids
reach the host the previous verification is done too, so its outcome is read without
waiting, and the loop learns that a request is done one round late.

Where drafting costs more than it gains (many rows, a high temperature), a round can be the
target's own step instead (``drafting``, a policy of ``speculative.drafting``): no draft,
one token a request, the pass one token wide. The drafter reads the context it missed at
its next round.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from dspark_compile.draft import DraftOutput, RoundInputs
from dspark_compile.errors import ConfigError, InputError
from dspark_compile.runtime import Runner
from dspark_compile.runtime.marks import StreamMark
from dspark_compile.runtime.transfer import download, upload
from dspark_compile.speculative.acceptance import verify_greedy, verify_rows
from dspark_compile.speculative.drafting import DraftPolicy
from dspark_compile.speculative.refill import Refills
from dspark_compile.speculative.requests import Completion, Decoded, Request
from dspark_compile.speculative.target import Target, pick_target_token

Schedule = Callable[[Tensor], Tensor]  # confidences [R, k] on the host -> verify lengths [R]


@torch.no_grad()
def decode(target: Target, runner: Runner, requests: Sequence[Request],
           temperature: float = 0.0, schedule: Optional[Schedule] = None,
           drafting: Optional[DraftPolicy] = None, refill_wait: float = 0.0) -> Decoded:
    """Every request's ``max_new_tokens`` new tokens, ``target.rows`` requests at a time.

    How many of each round's drafts are verified: the lengths a scheduled runner returns
    (:meth:`~dspark_compile.runtime.Runner.schedule`, from the round's confidences or,
    lagged, from each request's of rounds before), else ``schedule``'s of the round's
    confidences (for example a fixed length), else every draft. ``drafting``: which
    rounds draft (None: every round); the others are the target's own steps
    (:class:`~dspark_compile.speculative.drafting.MaxDraftRows`,
    :class:`~dspark_compile.speculative.drafting.WhileDraftingPays`). A request's drafter
    reads its prompt and the own steps after it at its first drafted round.
    ``refill_wait``: a finished request's row takes the next request at once (0), or rows
    wait to be refilled together until their idle passes add up to that many passes of
    every row (:class:`~dspark_compile.speculative.refill.Refills`; for a target whose
    prefill costs about that many passes whatever its prompts)."""
    if temperature > 0 and not runner.manifest["with_probs"]:
        raise ConfigError("temperature: sampled verification needs the draft distribution; "
                          "build the artifact with with_probs=True")
    if schedule is not None and not runner.lane.confidence_head:
        raise ConfigError("schedule: the drafter has no confidence head to schedule by")
    for i, request in enumerate(requests):
        if not request.prompt or request.max_new_tokens < 1:
            raise InputError(f"requests[{i}]", f"a prompt of {len(request.prompt)} tokens "
                             f"and max_new_tokens={request.max_new_tokens}",
                             "a prompt of at least one token and max_new_tokens >= 1")
    return _Loop(target, runner, requests, temperature, schedule, drafting,
                 Refills(target.rows, refill_wait)).run()


@dataclass
class _Verified:
    """A round's verification, queued on the device: what the host takes from it once the
    next round's download shows the device is past it."""
    rows: list[int]
    requests: list[int]
    accepted: Tensor  # host copies, filled by the stream
    emitted: Tensor
    verified: list[int]
    kept: list[bool]  # whether each request still wanted tokens (its round counts)
    drafted: bool  # False: the target's own step, no round of the drafter's


class _Loop:
    """The rounds. The host waits for the device once a round, for the draft's download;
    everything else it issues while the device is busy (copies through pinned memory, the
    verification's outcome read a round later), and it launches the target's pass before
    it does the round's bookkeeping per request."""

    def __init__(self, target: Target, runner: Runner, requests: Sequence[Request],
                 temperature: float, schedule: Optional[Schedule],
                 drafting: Optional[DraftPolicy], refills: Refills):
        self.target, self.runner, self.requests = target, runner, requests
        self.schedule, self.policy, self.refills = schedule, drafting, refills
        self.temperature, self.k, self.device = temperature, runner.lane.k, runner.device
        self.dtype = runner.lane.torch_dtype
        rows, device = target.rows, runner.device
        self.queue = deque(range(len(requests)))
        self.serving: list[Optional[int]] = [None] * rows  # a request's index per row
        self.slots: list[Optional[int]] = [None] * rows
        self.completions = [Completion() for _ in requests]
        self.made = [0] * len(requests)  # tokens per request, known before their values
        self.firsts: list[tuple[list[int], Tensor]] = []  # refills' first tokens, on the way
        self.position = torch.zeros(rows, dtype=torch.long, device=device)  # the anchor's
        self.anchor = torch.zeros(rows, dtype=torch.long, device=device)
        self.num_new = torch.zeros(rows, dtype=torch.long, device=device)
        self.seed = torch.zeros(rows, dtype=torch.long, device=device)
        self.features: Optional[Tensor] = None  # [rows, k+1, F]: each row's next context
        # a row's context its drafter has yet to read, where own steps have run since its
        # last round (or its prompt, from a refill): features [n, F] in order
        self.prompts: dict[int, list[Tensor]] = {}
        self.context = [0] * rows  # the context rows a row's last drafted round made
        self.temperatures: dict[int, Tensor] = {}  # [R] of the temperature, per R
        self.marks: dict[str, list[tuple[StreamMark, StreamMark]]] = {
            "draft": [], "verify": [], "prefill": [], "handoff": []}
        self.pass_tokens: list[int] = []  # the tokens each pass gave requests that wanted them
        self.drained: Optional[tuple[int, int]] = None  # passes, requests in when it ran dry

    def run(self) -> Decoded:
        start, first = time.perf_counter(), StreamMark(self.device)
        self.refill(list(range(min(self.target.rows, len(self.queue)))))
        pending: Optional[_Verified] = None
        while True:
            # in the runner's row order: a round of all its rows then needs no layout
            live = sorted((r for r in range(self.target.rows) if self.serving[r] is not None),
                          key=lambda r: self.runner.row_of(self.slots[r]))
            if not live:
                break
            inputs = out = None
            drafting = self.drafting(live)
            if drafting:  # its download waits for everything queued before it
                begin = StreamMark(self.device)
                inputs, index = self.round_inputs(live)
                out = self.runner.draft(inputs, [self.slots[r] for r in live])
                self.marks["draft"].append((begin, StreamMark(self.device)))
                self.take_firsts()
            else:  # the target's own step: its pass first, then the wait for the last one's
                index, queued = upload(live, self.device), StreamMark(self.device)
                if pending and pending.drafted:  # its outcome is read now: wait for it
                    queued.wait()
            done = self.finished(pending) if pending else []
            going = [i for i, r in enumerate(live) if r not in done]
            following = self.verify(live, going, out, inputs, index) if going else None
            if not drafting:
                queued.wait()
                self.take_firsts()
            if pending:
                self.record(pending)
            for row in done:
                self.runner.release(self.slots[row])
                self.serving[row] = self.slots[row] = None
            passes = len(self.marks["verify"])
            self.refills.free(done, passes)
            busy = sum(request is not None for request in self.serving)
            self.refill(self.refills.due(passes, busy, len(self.queue)))
            pending = following
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        span = {name: sum(b.seconds_to(e) for b, e in marks)
                for name, marks in self.marks.items()}
        for completion, request in zip(self.completions, self.requests):
            del completion.tokens[request.max_new_tokens:]
        busy_tokens, busy_seconds = 0, 0.0
        if self.drained is not None:  # the passes before, and the requests' first tokens
            passes, admitted = self.drained
            busy_tokens = sum(self.pass_tokens[:passes]) + admitted
            busy_seconds = first.seconds_to(self.marks["verify"][passes - 1][1])
        return Decoded(self.completions, time.perf_counter() - start, span["draft"],
                       span["verify"], span["prefill"], len(self.marks["verify"]), busy_tokens,
                       busy_seconds, span["handoff"])

    def refill(self, rows: list[int]) -> None:
        """The next requests into ``rows``: a fresh slot each, their prompts through the
        target, the target's first token picked, their next round a prompt round."""
        if not rows:
            return
        admitted = len(self.requests) - len(self.queue)
        chosen = [self.queue.popleft() for _ in rows]
        if not self.queue and admitted and self.drained is None:
            self.drained = (len(self.marks["verify"]), admitted)
        prompts = [self.requests[i].prompt for i in chosen]
        index = upload(rows, self.device)
        begin = StreamMark(self.device)
        last, features = self.target.prefill(rows, prompts)
        self.marks["prefill"].append((begin, StreamMark(self.device)))
        if self.features is None:
            self.features = features.new_zeros(self.target.rows, self.k + 1, features.shape[-1])
        lengths = upload([len(p) for p in prompts], self.device)
        self.seed[index] = upload([self.requests[i].seed for i in chosen], self.device)
        first = pick_target_token(last, self.temperature, self.seed[index], lengths)
        self.anchor[index], self.position[index], self.num_new[index] = first, lengths, lengths
        self.firsts.append((chosen, download(first)))
        for row, request, prompt in zip(rows, chosen, features):
            self.serving[row], self.slots[row] = request, self.runner.admit()
            self.made[request] = 1
            self.prompts[row] = [prompt]

    def take_firsts(self) -> None:
        """The refilled requests' first tokens into their completions (call after a wait)."""
        for requests, tokens in self.firsts:
            for request, token in zip(requests, tokens.tolist()):
                self.completions[request].tokens.append(token)
        self.firsts.clear()

    def drafting(self, live: list[int]) -> bool:
        """Whether the round drafts (else it is the target's own step): as the policy
        says, if any."""
        return self.policy is None or self.policy.drafts(len(live))

    def round_inputs(self, live: list[int]) -> tuple[RoundInputs, Tensor]:
        """The live rows' round (each row's accepted context rows, or its prompt), and the
        rows on the device."""
        index = upload(live, self.device)
        prompts = {r: torch.cat(self.prompts.pop(r)) for r in live if r in self.prompts}
        width = max([self.k + 1] + [len(p) for p in prompts.values()])
        features = self.features[index]
        if width > self.k + 1:  # room for a longer prompt
            features = torch.nn.functional.pad(features, (0, 0, 0, width - self.k - 1))
        for i, row in enumerate(live):
            if row in prompts:
                features[i, :len(prompts[row])] = prompts[row]
        if len(live) not in self.temperatures:
            self.temperatures[len(live)] = torch.full((len(live),), self.temperature,
                                                      device=self.device)
        return RoundInputs(features.to(self.dtype), self.num_new[index], self.anchor[index],
                           self.position[index], self.temperatures[len(live)],
                           self.seed[index]), index

    def verify(self, live: list[int], going: list[int], out: Optional[DraftOutput],
               inputs: Optional[RoundInputs], live_index: Tensor) -> _Verified:
        """The target's pass over every row, the live rows' drafts checked (``out`` None:
        the target's own step, no drafts); the rows that go on move to their next round.
        Returns the verification, still on its way to the host. With a schedule the pass is
        as wide as the longest verify length needs (the lengths are on the host already: no
        synchronisation)."""
        rows, lengths = [live[i] for i in going], None
        every = rows == list(range(self.target.rows))  # then nothing to pick or place
        if out is not None and out.lengths is not None:
            lengths = out.lengths if every else out.lengths[going]
        elif out is not None and self.schedule is not None:
            lengths = self.schedule(out.confidences if every else out.confidences[going])
        width = 0 if out is None else self.k if lengths is None else int(lengths.max())
        if width:  # on the round's critical path: up in one copy
            if every:
                drafted = out.ids[:, :width].contiguous()
            else:
                drafted = torch.zeros(self.target.rows, width, dtype=torch.long)
                drafted[rows] = out.ids[going, :width]
            drafted = upload(drafted, self.device)
            tokens = torch.cat([self.anchor[:, None], drafted], 1)
        else:  # the anchors alone: no copy
            drafted, tokens = self.anchor.new_empty(self.target.rows, 0), self.anchor[:, None]
        begin = StreamMark(self.device)
        if out is not None:  # the host's turn between the draft and its verification
            self.marks["handoff"].append((self.marks["draft"][-1][1], begin))
        logits, features = self.target.verify(tokens, self.position)
        self.marks["verify"].append((begin, StreamMark(self.device)))
        # the rest while the pass runs
        requests = [self.serving[row] for row in rows]
        kept = [self.made[r] < self.requests[r].max_new_tokens for r in requests]
        if out is not None:
            confidences = [[]] * len(rows) if out.confidences is None \
                else out.confidences[going].tolist()
            for request, keep, c in zip(requests, kept, confidences):
                if keep:
                    self.completions[request].confidences.append(c)
        all_go = len(going) == len(live)  # then the round's own rows, and inputs and q
        index = live_index if all_go else upload(rows, self.device)
        reuse = all_go and inputs is not None
        position = inputs.anchor_pos if reuse else self.position[index]
        device_lengths = None if lengths is None else upload(lengths, self.device)
        if self.temperature > 0:
            if out is None:
                q = logits.new_zeros(len(rows), 0, logits.shape[-1])
            else:
                q = out.probs[:, :width] if all_go \
                    else out.probs[upload(going, self.device), :width]
            seed = inputs.seed if reuse else self.seed[index]
            accepted, emitted = verify_rows(drafted, q, logits, index, self.temperature, seed,
                                            position, device_lengths)
        else:  # the rows' picks, not their [width, V] logits, gathered
            accepted, emitted = verify_greedy(drafted[index], logits.argmax(-1)[index],
                                              device_lengths)
        made = accepted + 1
        if out is None:  # after the context its drafter has yet to read (see drafting)
            step = features.clone()  # [rows, 1, F], the pass's own buffer
            for row in rows:
                if row not in self.prompts:  # it drafted last: the rows that round made
                    self.prompts[row] = [self.features[row, :self.context[row]].clone()]
                self.prompts[row].append(step[row])
            self.num_new[index] += 1
        else:  # zeros past this pass's rows (index_fill_: a scalar set by index would wait)
            if width < self.k:
                self.features.index_fill_(0, index, 0)
            self.features[index, :width + 1] = features[index]
            self.num_new[index] = made
        self.anchor[index] = emitted.gather(1, accepted[:, None])[:, 0]
        self.position[index] = position + made
        verified = [width] * len(rows) if lengths is None else lengths.tolist()
        return _Verified(rows, requests, download(accepted), download(emitted), verified,
                         kept, out is not None)

    def finished(self, pending: _Verified) -> list[int]:
        """The rows whose requests the previous round completed (its outcome is on the host
        by now: the round's download, or an own step's wait, waited for it; a step of the
        target's own accepted no drafts, which needs no reading)."""
        done = []
        counts = pending.accepted.tolist() if pending.drafted else [0] * len(pending.rows)
        for row, request, keep, accepted in zip(pending.rows, pending.requests, pending.kept,
                                                counts):
            self.made[request] += (accepted + 1) * keep
            if pending.drafted:
                self.context[row] = accepted + 1
            if self.made[request] >= self.requests[request].max_new_tokens:
                done.append(row)
        return done

    def record(self, pending: _Verified) -> None:
        """The previous round's accepted tokens into the requests it counted for."""
        accepted, emitted = pending.accepted.tolist(), pending.emitted.tolist()
        made = 0
        for i, (request, keep) in enumerate(zip(pending.requests, pending.kept)):
            if keep:
                completion = self.completions[request]
                if pending.drafted:
                    completion.accepted.append(accepted[i])
                    completion.verified.append(pending.verified[i])
                wanted = self.requests[request].max_new_tokens - len(completion.tokens)
                made += min(accepted[i] + 1, wanted)
                completion.tokens += emitted[i][:accepted[i] + 1]
        self.pass_tokens.append(made)
        if pending.drafted and self.policy is not None:
            self.policy.observe(1 + sum(accepted) / len(accepted), 1 + max(pending.verified))
