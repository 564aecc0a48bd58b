"""Self-distilled training data: prompts from what ships with Python (its help topics and the
standard library's docstrings) crossed with a hand-written topic list, answered by the
target itself with sampling and a repetition penalty. Only token ids are kept (a few MB),
so later runs need not regenerate them.

    python scripts/testbed/data.py --target testbed/target   # -> scripts/testbed/selfdistill.safetensors
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import pydoc
import random
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from target import load_target

DATA = Path(__file__).parent / "selfdistill.safetensors"  # made by this script, committed

TOPICS = ["lists", "dictionaries", "recursion", "reading files", "exceptions", "classes",
          "generators", "decorators", "sorting", "regular expressions", "unit tests",
          "binary search", "hash tables", "linked lists", "loops", "string formatting",
          "the solar system", "photosynthesis", "healthy breakfasts", "learning a language",
          "the water cycle", "time management", "volcanoes", "the internet", "gardening"]
TASKS = ["Explain {} in simple terms.", "Give three tips about {}.",
         "What are common mistakes with {}?", "Write a short paragraph about {}.",
         "Write a short Python example about {}."]
MODULES = ["json", "os.path", "itertools", "functools", "collections", "re", "math",
           "statistics", "string", "textwrap", "datetime", "pathlib", "random", "heapq",
           "bisect", "csv", "shutil", "glob", "fnmatch", "difflib", "base64", "hashlib"]


def prompts() -> list[str]:
    """Every prompt, in a fixed order."""
    found = [task.format(topic) for topic in TOPICS for task in TASKS]
    found += [f"What does the Python help topic {name} cover? Answer briefly."
              for name in sorted(pydoc.Helper.topics)]
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name, obj in sorted(vars(module).items()):
            doc = inspect.getdoc(obj) if callable(obj) and not name.startswith("_") else None
            if doc and getattr(obj, "__module__", None) == module.__name__:
                first = doc.split("\n\n")[0].replace("\n", " ")
                found.append(f"Explain what the Python function {module_name}.{name} does "
                             f"and show how to call it. Its documentation says: {first}")
    return found


def split(all_prompts: list[str], held_out: int, seed: int) -> tuple[list[str], list[str]]:
    """(training prompts, held-out prompts): a seeded shuffle."""
    order = list(all_prompts)
    random.Random(seed).shuffle(order)
    return order[held_out:], order[:held_out]


@torch.no_grad()
def generate_responses(model, tokenizer, texts: list[str], max_new_tokens: int, batch: int,
                       seed: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) per prompt: the target's own sampled answers."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:  # as transformers 5.17 converts the GGUF's tokenizer
        tokenizer.pad_token = tokenizer.eos_token
    torch.manual_seed(seed)
    pairs = []
    for start in range(0, len(texts), batch):
        chats = [tokenizer.apply_chat_template([{"role": "user", "content": t}],
                                               add_generation_prompt=True, tokenize=False)
                 for t in texts[start:start + batch]]
        encoded = tokenizer(chats, return_tensors="pt", padding=True,
                            add_special_tokens=False).to(model.device)
        out = model.generate(**encoded, do_sample=True, temperature=0.7, top_p=0.9,
                             repetition_penalty=1.2, max_new_tokens=max_new_tokens,
                             pad_token_id=tokenizer.pad_token_id)
        width = encoded["input_ids"].shape[1]
        for row, mask in zip(out, encoded["attention_mask"]):
            prompt = row[:width][mask.bool()].tolist()
            response = row[width:].tolist()
            if tokenizer.eos_token_id in response:  # keep the end token, drop the padding
                response = response[:response.index(tokenizer.eos_token_id) + 1]
            pairs.append((prompt, response))
        print(f"generated {len(pairs)}/{len(texts)}", flush=True)
    return pairs


def save(pairs: list[tuple[list[int], list[int]]], held_out: list[str], path: Path) -> None:
    tokens = [p + r for p, r in pairs]
    offsets = torch.tensor([0] + [len(t) for t in tokens]).cumsum(0)
    save_file({"tokens": torch.tensor([i for t in tokens for i in t], dtype=torch.int32),
               "offsets": offsets, "prompt_lengths": torch.tensor([len(p) for p, _ in pairs])},
              str(path), metadata={"held_out": json.dumps(held_out)})


def load(path: Path) -> tuple[list[Tensor], list[int], list[str]]:
    """(sequences of token ids, their prompt lengths, the held-out prompts)."""
    from safetensors import safe_open

    tensors = load_file(str(path))
    with safe_open(str(path), framework="pt") as f:
        held_out = json.loads(f.metadata()["held_out"])
    offsets = tensors["offsets"].tolist()
    sequences = [tensors["tokens"][a:b].long() for a, b in zip(offsets, offsets[1:])]
    return sequences, tensors["prompt_lengths"].tolist(), held_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, default=Path("testbed/target"))
    parser.add_argument("--out", type=Path, default=DATA)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--samples", type=int, default=4, help="answers per prompt")
    parser.add_argument("--held-out", type=int, default=32)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--limit", type=int, default=None, help="prompts (for a quick run)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    train, held_out = split(prompts(), args.held_out, args.seed)
    train = (train[:args.limit] if args.limit else train) * args.samples
    print(f"{len(train)} training prompts ({args.samples} answers each), "
          f"{len(held_out)} held out", flush=True)
    start = time.perf_counter()
    model = load_target(args.target, args.device)
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    pairs = generate_responses(model, tokenizer, train, args.max_new_tokens, args.batch,
                               args.seed)
    save(pairs, held_out, args.out)
    print(f"{args.out}: {sum(len(p) + len(r) for p, r in pairs)} tokens in "
          f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
