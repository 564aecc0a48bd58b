"""The testbed's static-cache target (scripts/testbed/llama.py) against transformers' own
LlamaForCausalLM: the same logits and tapped hidden states, fed in two passes."""

import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the dev extra has transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "testbed"))
from llama import StaticLlama  # noqa: E402


def test_two_passes_over_the_static_cache_match_one_full_forward():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=48, intermediate_size=64,
                                      num_hidden_layers=4, num_attention_heads=6,
                                      num_key_value_heads=2, head_dim=8, rope_theta=1e4,
                                      tie_word_embeddings=True)
    model = transformers.LlamaForCausalLM(config).eval()
    taps = [2, 0]
    tokens = torch.randint(0, 96, (3, 11))
    with torch.no_grad():
        ref = model(tokens, output_hidden_states=True)
    llama = StaticLlama(model, batch=3, slots=16, taps=taps)
    first = llama.forward(tokens[:, :7], torch.zeros(3, dtype=torch.long))
    second = llama.forward(tokens[:, 7:], torch.full((3,), 7))
    logits, features = (torch.cat(parts, 1) for parts in zip(first, second))
    torch.testing.assert_close(logits, ref.logits, atol=1e-5, rtol=1e-5)
    expected = torch.cat([ref.hidden_states[t + 1] for t in taps], -1)
    torch.testing.assert_close(features, expected, atol=1e-5, rtol=1e-5)


# The Triton linear in Triton's interpreter (CPU), against float64 products: shapes whose
# rows, columns and inner size are not multiples of the kernel's blocks; then the whole
# static target with it (passes of 7 and 4 rows x 3) against transformers' forward.
INTERPRETED = """
import sys, torch, transformers
sys.path.insert(0, sys.argv[1])
from linear import linear
from llama import StaticLlama
torch.manual_seed(0)
for m, n, k in [(1, 40, 70), (17, 33, 64), (8, 100, 130)]:
    x, w = torch.randn(m, k), torch.randn(n, k)
    error = (linear(x, w).double() - x.double() @ w.double().T).abs().max().item()
    assert error < 1e-4, (m, n, k, error)
config = transformers.LlamaConfig(vocab_size=96, hidden_size=48, intermediate_size=64,
                                  num_hidden_layers=2, num_attention_heads=6,
                                  num_key_value_heads=2, head_dim=8, tie_word_embeddings=True)
model = transformers.LlamaForCausalLM(config).eval()
tokens = torch.randint(0, 96, (3, 11))
with torch.no_grad():
    ref = model(tokens, output_hidden_states=True)
llama = StaticLlama(model, batch=3, slots=16, taps=[1], linear="triton")
first = llama.forward(tokens[:, :7], torch.zeros(3, dtype=torch.long))
second = llama.forward(tokens[:, 7:], torch.full((3,), 7))
logits = torch.cat([first[0], second[0]], 1)
torch.testing.assert_close(logits, ref.logits, atol=1e-5, rtol=1e-5)
print("ok")
"""


def test_the_triton_linear_matches_in_the_interpreter():
    pytest.importorskip("triton", reason="Triton is not installed (CPU wheels of torch lack it)")
    import os
    import subprocess
    folder = str(Path(__file__).resolve().parents[2] / "scripts" / "testbed")
    result = subprocess.run([sys.executable, "-c", INTERPRETED, folder], capture_output=True,
                            text=True, timeout=600, env=dict(os.environ, TRITON_INTERPRET="1"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-1] == "ok"
