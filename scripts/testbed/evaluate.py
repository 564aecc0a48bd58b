"""The drafter on the held-out prompts' greedy answers, every position of each answer an
anchor (``blocks.py``): the greedy acceptance that implies (exact for a round anchored
there: the accepted drafts are the leading positions whose pick is the target's token),
and the statistics of its rounds: how often the Markov bias changes the backbone's pick
and the pick's rank among the base logits, the margin ``max U - second U``, near-ties of
the final logits, and the confidence head's calibration (ECE per position).

    python scripts/testbed/evaluate.py --target testbed/target --drafter testbed/drafter \
        --out bench_out/testbed_statistics.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Iterator

import torch
from torch import Tensor

from blocks import Blocks, context, target_pass, teacher_forced
from data import DATA, MODES, load
from dspark_compile import lane_config, load_checkpoint
from dspark_compile.model import Drafter
from target import LANE, load_target

RANKS = {"0": (0, 1), "1": (1, 2), "2": (2, 3), "3-4": (3, 5), "5-9": (5, 10),
         "10+": (10, 1 << 30)}  # bins of the pick's rank among the base logits
MARGINS = [0.0, 0.125, 0.5, 1.0, 2.0]


@torch.no_grad()
def held_out_blocks(drafter: Drafter, target, sequences: list[Tensor], prompt_lengths: list[int],
                    device: torch.device, batch: int = 8, chunk: int = 512) -> Iterator[Blocks]:
    """Blocks anchored at every answer position ``s`` with ``k`` tokens after it; a block's
    ``rows`` index ``sequences``."""
    lane = drafter.lane
    for first in range(0, len(sequences), batch):
        group = sequences[first:first + batch]
        valid = torch.tensor([len(t) for t in group], device=device)
        tokens = torch.zeros(len(group), int(valid.max()), dtype=torch.long, device=device)
        for row, t in enumerate(group):
            tokens[row, :len(t)] = t.to(device)
        features, logits = target_pass(target, tokens, lane.target_layer_ids)
        anchors = [(row, s) for row, t in enumerate(group)
                   for s in range(prompt_lengths[first + row], len(t) - lane.k)]
        cache = context(drafter, features, valid)
        for start in range(0, len(anchors), chunk):
            rows, s = torch.tensor(anchors[start:start + chunk], device=device).T
            blocks = teacher_forced(drafter, cache, tokens, logits, rows, s)
            yield dataclasses.replace(blocks, rows=blocks.rows + first)


def validate(blocks: Iterator[Blocks]) -> dict:
    """Greedy tokens per round (bonus included) and acceptance per position, over every
    anchor; the same over the rounds a greedy decode makes (from each answer's first
    position, the next anchor after the accepted drafts and the target's token: the anchors
    a round reaches are more often hard ones, where the previous round stopped); DeepSpec's
    T = 1 estimate from each position's ``1 - TV(q, p)`` on the same tokens (on greedy
    answers it over-estimates rounds that sample)."""
    leading, accept, anchors = [], [], []
    for b in blocks:
        hits = b.z.argmax(-1) == b.labels
        leading.append(hits.long().cumprod(-1).sum(-1).cpu())
        tv = 0.5 * (b.z.softmax(-1) - b.target_logits.float().softmax(-1)).abs().sum(-1)
        accept.append((1 - tv).clamp(0, 1).cpu())
        anchors += zip(b.rows.tolist(), b.s.tolist())
    leading, accept = torch.cat(leading), torch.cat(accept)
    k = accept.shape[1]
    rounds = decode_rounds(dict(zip(anchors, leading.tolist())))
    return dict(blocks=len(leading), tokens_per_round=1 + leading.float().mean().item(),
                acceptance_by_position=[(leading > j).float().mean().item() for j in range(k)],
                decode_rounds=len(rounds), decode_tokens_per_round=1 + sum(rounds) / len(rounds),
                t1_tokens_per_round_estimate=1 + accept.cumprod(-1).sum(-1).mean().item())


def decode_rounds(accepted: dict[tuple[int, int], int]) -> list[int]:
    """The accepted drafts of each round a greedy decode makes, given those of a round at
    every anchor ``(sequence, s)``: each sequence from its first anchor while one is left."""
    first: dict[int, int] = {}
    for row, s in accepted:
        first[row] = min(first.get(row, s), s)
    rounds = []
    for row, s in sorted(first.items()):
        while (row, s) in accepted:
            rounds.append(accepted[row, s])
            s += accepted[row, s] + 1
    return rounds


def ece(confidence: Tensor, outcome: Tensor, bins: int = 10) -> float:
    """Expected calibration error over equal-width confidence bins."""
    index = (confidence * bins).long().clamp(max=bins - 1)
    total = 0.0
    for i in range(bins):
        inside = index == i
        if inside.any():
            gap = confidence[inside].mean() - outcome[inside].float().mean()
            total += inside.float().mean().item() * abs(gap.item())
    return total


def statistics(blocks: Iterator[Blocks]) -> dict:
    """Per draft position, over the positions a greedy round reaches (every earlier one
    accepted)."""
    parts: dict[str, list[Tensor]] = {n: [] for n in
                                      ("reached", "hit", "rank", "margin", "gap", "ulp", "c")}
    for b in blocks:
        pick = b.z.argmax(-1)
        hit = pick == b.labels
        parts["reached"].append(torch.cat([torch.ones_like(hit[:, :1]),
                                           hit[:, :-1].long().cumprod(-1).bool()], 1).cpu())
        parts["hit"].append(hit.cpu())
        base = b.base.float()
        parts["rank"].append((base > base.gather(-1, pick[..., None])).sum(-1).cpu())
        best = base.topk(2, -1).values
        parts["margin"].append((best[..., 0] - best[..., 1]).cpu())
        final = b.z.topk(2, -1).values
        parts["gap"].append((final[..., 0] - final[..., 1]).cpu())
        # one unit in the last place of the model dtype's z at the top score
        ulp = torch.finfo(b.base.dtype).eps * torch.exp2(final[..., 0].abs().log2().floor())
        parts["ulp"].append(ulp.cpu())
        parts["c"].append(b.confidence_logits.sigmoid().cpu())
    t = {n: torch.cat(v) for n, v in parts.items()}
    positions = []
    for j in range(t["hit"].shape[1]):
        r = t["reached"][:, j]
        rank, margin = t["rank"][r, j], t["margin"][r, j]
        gap, c, hit = t["gap"][r, j], t["c"][r, j], t["hit"][r, j]
        if not r.any():
            positions.append(dict(reached=0))
            continue
        positions.append(dict(
            reached=int(r.sum()), accepted_if_reached=hit.float().mean().item(),
            markov_changes_pick=(rank > 0).float().mean().item(),
            pick_rank_in_base={name: ((rank >= lo) & (rank < hi)).float().mean().item()
                               for name, (lo, hi) in RANKS.items()},
            base_margin_quantiles={q: margin.quantile(q).item() for q in (0.01, 0.1, 0.5, 0.9)},
            base_margin_at_most={m: (margin <= m).float().mean().item() for m in MARGINS},
            final_exact_ties=int((gap == 0).sum()),
            final_within_one_ulp=int((gap <= t["ulp"][r, j]).sum()),
            mean_confidence=c.mean().item(), ece=ece(c, hit)))
    return dict(blocks=len(t["hit"]), positions=positions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, default=Path("testbed/target"))
    parser.add_argument("--drafter", type=Path, default=Path("testbed/drafter"))
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--out", type=Path, default=Path("bench_out/testbed_statistics.json"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--modes", nargs="+", default=["greedy"], choices=MODES,
                        help="the held-out answers to force: greedy, or those sampled at "
                             "T = 1 (where the T = 1 estimate reads the contexts a sampled "
                             "run meets)")
    args = parser.parse_args()
    device = torch.device(args.device)
    target = load_target(args.target, device)
    drafter = load_checkpoint(args.drafter, lane_config(LANE), device, verifier=args.target)
    sequences, prompt_lengths = load(args.data).select(held_out=True, modes=tuple(args.modes))
    blocks = lambda: held_out_blocks(drafter, target, sequences, prompt_lengths, device)  # noqa: E731
    result = dict(drafter=str(args.drafter), modes=args.modes, answers=len(sequences),
                  validation=validate(blocks()), statistics=statistics(blocks()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result["validation"]))
    print(args.out)


if __name__ == "__main__":
    main()
