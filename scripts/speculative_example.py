"""Speculative decoding end to end with a small random Qwen3 target (transformers).

    python scripts/speculative_example.py --lane tiny --backend eager --temperature 0

Prints the tokens accepted per round and the acceptance at each draft position. With
random weights the drafter rarely agrees with the target: the point is the machinery
(and that greedy output equals the target's own greedy generation, which it checks).
"""

from __future__ import annotations

import argparse
import tempfile

import torch

try:
    import transformers
except ImportError:
    raise SystemExit("speculative_example.py needs transformers for its target model: "
                     "pip install transformers (the dev extra has it)") from None

from dspark_compile.compile import build_artifact
from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import lane_config
from dspark_compile.speculative import generate, target_greedy
from dspark_compile.runtime import load_runner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lane", default="tiny")
    parser.add_argument("--backend", default="eager")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    lane = lane_config(args.lane)
    torch.manual_seed(args.seed)
    target = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        vocab_size=lane.target_vocab_size, hidden_size=lane.hidden_size,
        intermediate_size=2 * lane.hidden_size, num_hidden_layers=max(lane.target_layer_ids) + 2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=lane.hidden_size // 4)).eval()
    drafter = random_drafter(lane, "cpu", seed=args.seed)
    with tempfile.TemporaryDirectory() as root:
        path, _ = build_artifact(drafter, args.backend, [1], root,
                                 with_probs=args.temperature > 0)
        runner = load_runner(path, "cpu")
        prompt = [3, 14, 15, 92, 65]
        result = generate(target, runner, prompt, args.tokens, args.temperature, args.seed)
    print(f"lane {lane.name}, backend {args.backend}, temperature {args.temperature}")
    print("tokens:", result.tokens)
    print("accepted per round:", result.accepted)
    print("acceptance by draft position:",
          " ".join(f"{rate:.2f}" for rate in result.acceptance_by_position(lane.k)))
    print(f"tokens per round: {(len(result.tokens) - len(prompt) - 1) / len(result.accepted):.2f}")
    if args.temperature == 0:
        same = result.tokens == target_greedy(target, prompt, args.tokens, "cpu")
        print("equals the target's own greedy generation:", same)


if __name__ == "__main__":
    main()
