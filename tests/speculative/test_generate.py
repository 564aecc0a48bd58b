"""End to end with a real target architecture: a small random Qwen3 from transformers."""

import numpy as np
import pytest
import torch

from dspark_compile.compile import build_artifact
from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import lane_config
from dspark_compile.speculative import generate, target_greedy
from dspark_compile.runtime import load_runner

transformers = pytest.importorskip("transformers", reason="the end-to-end tests need "
                                   "transformers: pip install -e '.[dev]'")


def qwen3_target(vocab: int, seed: int, device) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = transformers.Qwen3Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=1024)
    return transformers.Qwen3ForCausalLM(config).to(device).eval()


def runner_for(lane, drafter_seed, tmp_path, device, with_probs=False):
    drafter = random_drafter(lane, device, seed=drafter_seed)
    path, _ = build_artifact(drafter, "eager", [1], tmp_path, with_probs=with_probs)
    return load_runner(path, device)


@pytest.mark.parametrize("lane_name,drafter_seed", [("tiny", 0), ("tiny", 1), ("tiny_d2t", 2)])
def test_greedy_speculative_decoding_is_lossless(tmp_path, device, lane_name, drafter_seed):
    target = qwen3_target(512, seed=5, device=device)
    runner = runner_for(lane_config(lane_name), drafter_seed, tmp_path, device)
    for prompt in ([1, 2, 3], [400, 17, 17, 9, 250, 3, 77], list(range(40, 60))):
        result = generate(target, runner, prompt, max_new_tokens=24)
        assert result.tokens == target_greedy(target, prompt, 24, device)
        # the prompt pass gives the first token; the rounds emitted the rest
        assert sum(a + 1 for a in result.accepted) >= 24 - 1


def test_a_drafter_that_agrees_with_the_target_gets_every_draft_accepted(tmp_path, device):
    """Zero output heads on both sides: every logit ties and the lowest index, 0, wins on
    the target and in the drafter alike, so every draft is accepted."""
    target = qwen3_target(512, seed=6, device=device)
    lane = lane_config("tiny")
    runner = runner_for(lane, 3, tmp_path, device)
    with torch.no_grad():
        target.lm_head.weight.zero_()
        runner.drafter.lm_head.weight.zero_()
        runner.drafter.markov_head.markov_w2.weight.zero_()
    result = generate(target, runner, [1, 2, 3], max_new_tokens=20)
    assert result.tokens[3:] == [0] * 20
    assert result.acceptance_by_position(lane.k) == [1.0] * lane.k


def test_sampling_matches_the_target_distribution(tmp_path, device):
    """Over many seeds, the second generated token (the first the speculative loop emits)
    follows the target's own distribution at temperature 1: chi-square against the exact
    mixture sum_x1 p(x1) p(x2 | x1)."""
    vocab = 8
    lane = lane_config("tiny", target_vocab_size=vocab, draft_vocab_size=vocab, mask_token_id=7)
    target = qwen3_target(vocab, seed=7, device=device)
    runner = runner_for(lane, 4, tmp_path, device, with_probs=True)
    prompt, runs = [1, 5, 2], 1500
    with torch.no_grad():
        p1 = torch.softmax(target(torch.tensor([prompt], device=device)).logits[0, -1], -1)
        following = torch.stack([torch.softmax(target(torch.tensor(
            [prompt + [x]], device=device)).logits[0, -1], -1) for x in range(vocab)])
    expected = (p1[:, None] * following).sum(0).double().cpu().numpy()
    counts = np.zeros(vocab)
    rejected = 0
    for seed in range(runs):
        result = generate(target, runner, prompt, max_new_tokens=2, temperature=1.0, seed=seed)
        counts[result.tokens[4]] += 1
        rejected += result.accepted[0] == 0
    statistic = float(((counts - expected * runs) ** 2 / (expected * runs)).sum())
    assert statistic < 24.3  # chi-square, 7 degrees of freedom, 99.9th percentile
    assert rejected > 0  # the drafter is not the target: corrections were exercised
