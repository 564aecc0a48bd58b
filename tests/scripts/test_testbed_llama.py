"""The testbed's static-cache target (scripts/testbed/llama.py) against transformers' own
LlamaForCausalLM: the same logits and tapped hidden states, fed in two passes."""

import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the dev extra has transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "testbed"))
from llama import LlamaTarget, StaticLlama  # noqa: E402


def llama_model() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=48, intermediate_size=64,
                                      num_hidden_layers=4, num_attention_heads=6,
                                      num_key_value_heads=2, head_dim=8, rope_theta=1e4,
                                      tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(config).eval()


def test_two_passes_over_the_static_cache_match_one_full_forward():
    model = llama_model()
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


def test_a_pass_padded_to_a_wider_one_gives_transformers_outputs_for_its_own_tokens():
    """A pass of 2 tokens run as one of 4 (``pad``): the logits of its 2 tokens, and the
    next pass at their end reads a cache as if the padding was never there."""
    model = llama_model()
    tokens = torch.randint(0, 96, (2, 9))
    with torch.no_grad():
        ref = model(tokens).logits
    target = LlamaTarget(model, rows=2, slots=16, taps=[1], n=4, graphs=False, pad={2: 4})
    target.prefill([0, 1], tokens[:, :5].tolist())
    padded, _ = target.verify(tokens[:, 5:7], torch.full((2,), 5))
    after, _ = target.verify(tokens[:, 7:9], torch.full((2,), 7))
    assert padded.shape[1] == after.shape[1] == 2
    torch.testing.assert_close(torch.cat([padded, after], 1), ref[:, 5:9], atol=1e-5,
                               rtol=1e-5)
