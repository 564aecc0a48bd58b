"""How much of W2 the certified Markov walk (``dspark_compile.draft.certified``) reads on
real rounds: the trained drafter's blocks on the held-out answers (``evaluate.py``'s, the
positions a greedy round reaches; ``--modes t1``: the answers sampled at T = 1, every
position, each step sampling at T = 1), and the same contexts through a drafter of random
weights. Per draft position: the fraction of W2's rows one request's step reads (mean,
quantiles, most), the same for batches of 8 and 64 requests (the union of their rows),
how often a step stays within a budget of rows, and whether every pick is the full walk's.

    python scripts/testbed/certificate.py --target testbed/target --drafter testbed/drafter

``--rounds-out FILE``: also saves ``--rounds`` of the trained drafter's rounds on the
greedy answers, spread over them (their base logits ``[N, k, V]`` and anchors, which are a
real round's: the backbone drafts the block without the Markov walk's picks), and its W1
and W2, for ``markov_loop_bench.py --rounds``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Iterator

import torch
from safetensors.torch import save_file
from torch import Tensor

from blocks import Blocks
from data import DATA, MODES, load
from dspark_compile import lane_config, load_checkpoint
from dspark_compile.checkpoint import random_drafter
from dspark_compile.draft.certified import certified_step, contenders, scores
from dspark_compile.model.heads import row_norms
from dspark_compile.model import Drafter
from dspark_compile.rng import gumbel
from evaluate import held_out_blocks
from target import LANE, load_target

BATCHES = (8, 64)  # requests whose steps share one read of each row
BUDGETS = (0.01, 0.02, 0.05, 0.1)  # fractions of W2's rows
QUANTILES = (0.5, 0.9, 0.99)


@torch.no_grad()
def reads(drafter: Drafter, blocks: Iterator[Blocks], sequences: list[Tensor],
          temperature: float) -> dict:
    """Per draft position, the rows each request's step reads ``[N]`` and the rows of each
    batch's step, over the positions counted (reached where greedy, all where sampling),
    and how many picks differ from the full walk's."""
    head = drafter.markov_head
    w1, w2 = head.markov_w1.weight, head.markov_w2.weight
    norms = row_norms(w2)
    k, V = drafter.lane.k, w2.shape[0]
    single: list[list[Tensor]] = [[] for _ in range(k)]
    batched = {b: [[] for _ in range(k)] for b in BATCHES}
    differ = picks = 0
    for b in blocks:
        prevs = torch.stack([sequences[r][s:s + k] for r, s in zip(b.rows.tolist(),
                                                                  b.s.tolist())])
        t = torch.full((len(prevs),), temperature)
        counted = torch.ones_like(b.labels, dtype=torch.bool)
        if temperature == 0:  # reached: every earlier pick the answer's token
            hits = (b.z.argmax(-1) == b.labels).long()
            counted[:, 1:] = hits[:, :-1].cumprod(-1).bool()
        for j in range(k):
            rows = counted[:, j]
            if not rows.any():
                continue
            e, base = w1[prevs[rows, j].to(w1.device)], b.base[rows, j]
            noise = gumbel(b.rows[rows], b.s[rows], j, V)
            scored, seeds = contenders(w2, norms, e, base, noise, t[rows])
            single[j].append(scored.sum(-1) + seeds.shape[1])
            for size in BATCHES:
                for part in scored.split(size):
                    if len(part) == size:
                        batched[size][j].append(part.any(0).sum()[None]
                                                + size * seeds.shape[1])
            pick, _ = certified_step(w2, norms, e, base, noise, t[rows])
            full = scores(b.z[rows, j], noise, t[rows]).argmax(-1)  # the full walk's
            differ += int((pick != full).sum())
            picks += int(rows.sum())
    return dict(single=single, batched=batched, differ=differ, picks=picks, vocab=V)


def summary(counts: list[Tensor], vocab: int) -> dict:
    """The fraction of W2's rows read: mean, quantiles, most, and how often within each
    budget."""
    if not counts:
        return dict(steps=0)
    f = torch.cat(counts).double() / vocab
    return dict(steps=len(f), mean=f.mean().item(),
                quantiles={q: f.quantile(q).item() for q in QUANTILES}, most=f.max().item(),
                within_budget={b: (f <= b).double().mean().item() for b in BUDGETS})


def report(r: dict) -> dict:
    """:func:`reads`' counts as :func:`summary` of each position, one request and batched."""
    return dict(picks=r["picks"], picks_differing_from_the_full_walk=r["differ"],
                rows=r["vocab"],
                positions=[dict(one_request=summary(r["single"][j], r["vocab"]),
                                **{f"batch_{b}": summary(r["batched"][b][j], r["vocab"])
                                   for b in BATCHES})
                           for j in range(len(r["single"]))])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, default=Path("testbed/target"))
    parser.add_argument("--drafter", type=Path, default=Path("testbed/drafter"))
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--modes", nargs="+", default=["greedy", "t1"], choices=MODES)
    parser.add_argument("--answers", type=int, default=None, help="the first N held-out answers")
    parser.add_argument("--out", type=Path, default=Path("bench_out/certificate.json"))
    parser.add_argument("--rounds-out", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=32)
    args = parser.parse_args()
    device = torch.device("cpu")
    target = load_target(args.target, device)
    trained = load_checkpoint(args.drafter, lane_config(LANE), device, verifier=args.target)
    drafters = dict(trained=trained, random=random_drafter(trained.lane, device, seed=0))
    result = dict(drafter=str(args.drafter), lane=LANE)
    for mode in args.modes:
        sequences, prompt_lengths = load(args.data).select(held_out=True, modes=(mode,))
        sequences, prompt_lengths = sequences[:args.answers], prompt_lengths[:args.answers]
        temperature = 0.0 if mode == "greedy" else 1.0
        for name, drafter in drafters.items():
            blocks = held_out_blocks(drafter, target, sequences, prompt_lengths, device)
            result[f"{name}_{mode}"] = report(reads(drafter, blocks, sequences, temperature))
            print(name, mode, json.dumps(result[f"{name}_{mode}"]["positions"][0]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(args.out)
    if args.rounds_out:
        sequences, prompt_lengths = load(args.data).select(held_out=True, modes=("greedy",))
        save_rounds(trained, held_out_blocks(trained, target, sequences, prompt_lengths,
                                             device), sequences, args.rounds, args.rounds_out)


def save_rounds(drafter: Drafter, blocks: Iterator[Blocks], sequences: list[Tensor],
                count: int, path: Path) -> None:
    """``count`` rounds spread evenly over ``blocks``, with the drafter's Markov weights."""
    base, anchors = [], []
    for b in blocks:
        base.append(b.base)
        anchors.append(torch.stack([sequences[r][s] for r, s in zip(b.rows.tolist(),
                                                                    b.s.tolist())]))
    base, anchors = torch.cat(base), torch.cat(anchors)
    pick = torch.linspace(0, len(base) - 1, count).long()
    head = drafter.markov_head
    save_file({"base": base[pick].contiguous(), "anchor": anchors[pick].contiguous(),
               "w1": head.markov_w1.weight.contiguous(),
               "w2": head.markov_w2.weight.contiguous()}, str(path))
    print(path)


if __name__ == "__main__":
    main()
