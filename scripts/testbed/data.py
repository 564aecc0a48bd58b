"""Self-distilled training data: prompts from what ships with Python (its help topics and the
standard library's docstrings and their classes' methods) crossed with a hand-written topic
list, answered by the target itself: greedily, at T = 1, and sampled with a repetition
penalty (T 0.7, top-p 0.9, penalty 1.2, transformers' own logits processors). Only token
ids are kept (uint16, a few MB), so later runs need not regenerate them. The held-out
prompts' answers are kept apart: the drafter never trains on them; they validate it.

    python scripts/testbed/data.py --target testbed/target  # -> data/testbed/
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import pydoc
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor

from dspark_compile.speculative import pick_target_token
from llama import StaticLlama, captured
from target import load_target

# made by this script, committed
DATA = Path(__file__).resolve().parents[2] / "data" / "testbed" / "selfdistill.safetensors"
MODES = ["greedy", "t1", "penalty"]  # an answer's decoding; "penalty": T 0.7, top-p 0.9, 1.2
# SmolLM2's chat template closes a turn with it. Not the tokenizer's eos: transformers 5.17
# reads <|im_start|> as that from the GGUF (5.24 reads <|im_end|>).
END_OF_TURN = "<|im_end|>"

TOPICS = ["lists", "dictionaries", "recursion", "reading files", "exceptions", "classes",
          "generators", "decorators", "sorting", "regular expressions", "unit tests",
          "binary search", "hash tables", "linked lists", "loops", "string formatting",
          "sets", "tuples", "list comprehensions", "closures", "type hints",
          "virtual environments", "command-line arguments", "JSON files", "CSV files",
          "dates and times", "random numbers", "threads", "async functions", "logging",
          "debugging", "git", "SQL queries", "HTTP requests", "big-O notation", "queues",
          "stacks", "trees", "graphs", "dynamic programming", "the solar system",
          "photosynthesis", "healthy breakfasts", "learning a language", "the water cycle",
          "time management", "volcanoes", "the internet", "gardening", "the moon",
          "earthquakes", "rainbows", "the human heart", "saving money", "writing an email",
          "job interviews", "sleep", "exercise", "cooking rice", "the Roman Empire",
          "electricity", "climate", "bees"]
TASKS = ["Explain {} in simple terms.", "Give three tips about {}.",
         "What are common mistakes with {}?", "Write a short paragraph about {}.",
         "Write a short Python example about {}.", "Summarize {} in two sentences.",
         "What should a beginner know about {}?", "Describe {} to a ten-year-old."]
MODULES = ["json", "os", "os.path", "itertools", "functools", "collections", "re", "math",
           "statistics", "string", "textwrap", "datetime", "pathlib", "random", "heapq",
           "bisect", "csv", "shutil", "glob", "fnmatch", "difflib", "base64", "hashlib",
           "operator", "copy", "pprint", "enum", "dataclasses", "typing", "inspect", "io",
           "tempfile", "zipfile", "tarfile", "gzip", "struct", "array", "calendar", "time",
           "decimal", "fractions", "uuid", "urllib.parse", "html", "shlex", "argparse",
           "logging", "threading", "queue", "subprocess", "socket", "sqlite3", "unittest",
           "contextlib", "abc", "weakref", "secrets", "zlib", "codecs", "locale"]
DOC_CHARS = 300  # of a docstring's first paragraph in a prompt


def documented(module_name: str) -> list[tuple[str, str]]:
    """(qualified name, first paragraph of its docstring) of a module's public functions,
    classes and their methods, defined in it."""
    module = importlib.import_module(module_name)
    found = []
    for name, obj in sorted(vars(module).items()):
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        members = [(name, obj)]
        if inspect.isclass(obj):
            members += [(f"{name}.{m}", f) for m, f in sorted(vars(obj).items())
                        if not m.startswith("_") and callable(f)]
        for qualified, member in members:
            doc = inspect.getdoc(member) if callable(member) else None
            if doc:
                first = " ".join(doc.split("\n\n")[0].split())[:DOC_CHARS]
                found.append((f"{module_name}.{qualified}", first))
    return found


def prompts() -> list[str]:
    """Every prompt, in a fixed order."""
    found = [task.format(topic) for topic in TOPICS for task in TASKS]
    found += [f"What does the Python help topic {name} cover? Answer briefly."
              for name in sorted(pydoc.Helper.topics)]
    for module_name in MODULES:
        found += [f"Explain what the Python function {name} does and show how to call it. "
                  f"Its documentation says: {doc}" for name, doc in documented(module_name)]
    return found


def split(all_prompts: list[str], held_out: int, seed: int) -> tuple[list[str], list[str]]:
    """(training prompts, held-out prompts): a seeded shuffle."""
    order = list(all_prompts)
    random.Random(seed).shuffle(order)
    return order[held_out:], order[:held_out]


def encode(tokenizer, texts: list[str]) -> list[list[int]]:
    """Chat prompts: the user's text and the assistant's turn opened."""
    chats = [tokenizer.apply_chat_template([{"role": "user", "content": t}],
                                           add_generation_prompt=True, tokenize=False)
             for t in texts]
    return tokenizer(chats, add_special_tokens=False)["input_ids"]


def penalty_processors():
    from transformers import (LogitsProcessorList, RepetitionPenaltyLogitsProcessor,
                              TemperatureLogitsWarper, TopPLogitsWarper)
    return LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.2),
                                TemperatureLogitsWarper(0.7), TopPLogitsWarper(0.9)])


@torch.no_grad()
def generate(model, prompts: list[list[int]], mode: str, max_new_tokens: int, batch: int,
             eos: int, seed: int) -> list[list[int]]:
    """The target's answer to each prompt in ``mode`` (up to and with its end token),
    ``batch`` prompts of similar length at a time over ``llama.StaticLlama``, each step one
    CUDA graph on CUDA. Greedy answers are the target's argmax at every step."""
    device = model.device
    llama = StaticLlama(model, batch, max(map(len, prompts)) + max_new_tokens + 1, taps=[0])
    step = captured(llama, batch, 1) if device.type == "cuda" else llama.forward
    processors = penalty_processors()
    generator = torch.Generator(device=device).manual_seed(seed)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    answers: list[list[int]] = [[] for _ in prompts]
    for first in range(0, len(order), batch):
        group = order[first:first + batch]
        rows = [prompts[i] for i in group] + [prompts[group[0]]] * (batch - len(group))
        lengths = torch.tensor([len(r) for r in rows], device=device)
        # padding repeats each row's first token: the repetition penalty sees only the prompt
        history = torch.tensor([r + r[:1] * (int(lengths.max()) - len(r)) for r in rows],
                               device=device)
        logits, _ = llama.forward(history, torch.zeros_like(lengths))
        last = logits[torch.arange(batch, device=device), lengths - 1]
        position, seeds = lengths.clone(), torch.tensor(group + [0] * (batch - len(group)),
                                                        device=device) + seed * len(prompts)
        done = torch.zeros(batch, dtype=torch.bool, device=device)
        new = []
        for i in range(max_new_tokens):
            if mode == "penalty":
                scores = processors(history, last)
                token = torch.multinomial(scores.softmax(-1), 1, generator=generator)[:, 0]
                history = torch.cat([history, token[:, None]], 1)
            else:
                token = pick_target_token(last, 0.0 if mode == "greedy" else 1.0, seeds,
                                          position)
            new.append(token)
            done |= token == eos
            if i % 16 == 15 and bool(done.all()):
                break
            logits, _ = step(token[:, None], position)
            last, position = logits[:, 0], position + 1
        tokens = torch.stack(new, 1).tolist()
        for i, answer in zip(group, tokens):
            answers[i] = answer[:answer.index(eos) + 1] if eos in answer else answer
        print(f"{mode}: {first + len(group)}/{len(prompts)}", flush=True)
    return answers


@dataclass
class Data:
    """Token ids of each prompt + answer, the prompt's length, the answer's decoding mode
    (an index into MODES), whether its prompt is held out, and the held-out prompts."""
    sequences: list[Tensor]
    prompt_lengths: list[int]
    modes: list[int]
    held_out: list[bool]
    held_out_prompts: list[str]

    def select(self, held_out: bool, modes: tuple[str, ...] = tuple(MODES)
               ) -> tuple[list[Tensor], list[int]]:
        """(sequences, prompt lengths) of the held-out answers or the training ones."""
        keep = [i for i, (m, h) in enumerate(zip(self.modes, self.held_out))
                if h == held_out and MODES[m] in modes]
        return [self.sequences[i] for i in keep], [self.prompt_lengths[i] for i in keep]


def save(data: Data, path: Path) -> None:
    offsets = torch.tensor([0] + [len(t) for t in data.sequences]).cumsum(0)
    save_file({"tokens": torch.cat(data.sequences).to(torch.uint16), "offsets": offsets,
               "prompt_lengths": torch.tensor(data.prompt_lengths),
               "modes": torch.tensor(data.modes, dtype=torch.int8),
               "held_out": torch.tensor(data.held_out)},
              str(path), metadata={"held_out": json.dumps(data.held_out_prompts)})


def load(path: Path) -> Data:
    tensors = load_file(str(path))
    with safe_open(str(path), framework="pt") as f:
        held_out_prompts = json.loads(f.metadata()["held_out"])
    offsets = tensors["offsets"].tolist()
    tokens = tensors["tokens"].long()
    return Data([tokens[a:b] for a, b in zip(offsets, offsets[1:])],
                tensors["prompt_lengths"].tolist(), tensors["modes"].tolist(),
                tensors["held_out"].tolist(), held_out_prompts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, default=Path("testbed/target"))
    parser.add_argument("--out", type=Path, default=DATA)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--modes", nargs="+", default=["greedy", "t1", "t1", "penalty"],
                        choices=MODES, help="one answer per prompt and mode listed")
    parser.add_argument("--held-out", type=int, default=32)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--limit", type=int, default=None, help="prompts (for a quick run)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    train, held_out = split(prompts(), args.held_out, args.seed)
    texts = held_out + train[:args.limit]
    start = time.perf_counter()
    model = load_target(args.target, args.device)
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    encoded = encode(tokenizer, texts)
    print(f"{len(texts)} prompts ({len(held_out)} held out), answers {args.modes}", flush=True)
    data = Data([], [], [], [], held_out)
    for n, mode in enumerate(args.modes):
        answers = generate(model, encoded, mode, args.max_new_tokens, args.batch,
                           tokenizer.convert_tokens_to_ids(END_OF_TURN), args.seed + n)
        data.sequences += [torch.tensor(p + a) for p, a in zip(encoded, answers)]
        data.prompt_lengths += [len(p) for p in encoded]
        data.modes += [MODES.index(mode)] * len(encoded)
        data.held_out += [i < len(held_out) for i in range(len(encoded))]
    save(data, args.out)
    print(f"{args.out}: {sum(map(len, data.sequences))} tokens in "
          f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
