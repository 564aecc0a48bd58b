"""The testbed's code path on the CPU at a tiny scale, without the GGUF: a random Llama
from transformers as the target, its own sampled continuations as data, a few training
steps, the speculators checkpoint read back, and draft -> verify through the runtime."""

import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the dev extra has transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "testbed"))
from e2e import speculative, target_alone  # noqa: E402
from train import train  # noqa: E402

from dspark_compile import lane_config, load_checkpoint, load_runner, save_checkpoint  # noqa: E402
from dspark_compile.compile import build_artifact  # noqa: E402


def test_a_trained_drafter_loads_and_decodes_losslessly(tmp_path):
    torch.manual_seed(0)
    target = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        tie_word_embeddings=True)).eval()
    target.save_pretrained(tmp_path / "target")
    lane = lane_config("tiny", hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8,
                       intermediate_size=64, target_vocab_size=64, draft_vocab_size=64,
                       mask_token_id=63, target_layer_ids=[0, 2], k=3, markov_rank=16,
                       max_context=256, max_batch=2)
    prompts = torch.randint(0, 63, (24, 4))
    with torch.no_grad():  # greedy: a random target's samples are near uniform, unlearnable
        sequences = list(target.generate(prompts, do_sample=False, max_new_tokens=48,
                                         pad_token_id=0))
    drafter, history = train(target, lane, sequences, [4] * len(sequences), steps=30,
                             batch=8, length=52, anchors=4, lr=1e-2, seed=0,
                             device=torch.device("cpu"))
    assert sum(history[-5:]) < sum(history[:5]) - 1.0  # the block cross-entropy falls
    save_checkpoint(drafter, tmp_path / "drafter", "speculators", verifier=tmp_path / "target")
    loaded = load_checkpoint(tmp_path / "drafter", lane, "cpu", verifier=tmp_path / "target")
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    runner = load_runner(build_artifact(loaded, "eager", [2], tmp_path / "artifacts")[0])
    requests = [p.tolist() for p in prompts[:2]]
    alone, _, _ = target_alone(target, requests, 24, 0.0, False, lane.target_layer_ids,
                               torch.device("cpu"))
    run = speculative(target, runner, requests, 24, 0.0, False, torch.device("cpu"))
    assert run["tokens"] == alone
    assert sum(run["accepted"]) > 0  # the trained drafter's tokens were accepted
