"""Make the DeepSpec fixtures with DeepSpec's own code: tiny ``Qwen3DSparkModel`` drafters
configured by ``build_draft_config`` (then, for the variants, the config fields a published
file may carry that DeepSpec accepts), saved by ``save_pretrained``, loaded back by
``from_pretrained``, and greedy draft rounds of the loaded model through DeepSpec's
inference path (``forward_dspark_draft_block`` with its KV cache, then
``build_dspark_proposal``) recorded in ``reference.safetensors``. The fixture beside this
file goes to ``checkpoint/``; the variants to ``../deepspec_variants/<name>/``.

DeepSpec is not on PyPI; from the repository root, with a DeepSpec checkout (afdfa7c) and
DeepSpec's transformers (5.10.2):

    PYTHONPATH=<DeepSpec checkout> python tests/checkpoint/deepspec_tiny/make.py
"""

from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import DynamicCache, Qwen3Config

from deepspec.eval.dspark.draft_ops import build_dspark_proposal, forward_dspark_draft_block
from deepspec.modeling.dspark.qwen3.config import build_draft_config
from deepspec.modeling.dspark.qwen3.modeling import Qwen3DSparkModel

HERE = Path(__file__).resolve().parent
VARIANTS_DIR = HERE.parent / "deepspec_variants"
BLOCK, MASK, VOCAB = 4, 255, 256


class Args(dict):
    __getattr__ = dict.__getitem__


# the fixture: non-default values that change the arithmetic (a scaled RoPE, the eps, the
# embedding tap -1) and a window DeepSpec never applies; two rounds
FIXTURE = ({"rms_norm_eps": 1e-5, "use_sliding_window": True, "sliding_window": 4,
            "max_window_layers": 0,
            "rope_parameters": {"rope_type": "linear", "rope_theta": 5e5, "factor": 2.0}},
           {"target_layer_ids": [-1, 3, 6]}, {})
# name -> (target config fields, draft args, fields set on the draft config afterwards);
# three rounds each
VARIANTS = {
    # a gated head, llama3 RoPE, tied embeddings in the config (DeepSpec keeps its own
    # lm_head), sliding layer types (DeepSpec's draft attention has no mask)
    "gated_llama3_tied_sliding": (
        {"hidden_act": "silu", "rope_parameters": {
            "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
        {"markov_head_type": "gated"},
        {"tie_word_embeddings": True, "layer_types": ["sliding_attention", "full_attention"],
         "sliding_window": 4, "use_sliding_window": True}),
    # the rnn head, gelu_new, yarn
    "rnn_gelu_new_yarn": (
        {"hidden_act": "gelu_new", "rope_parameters": {
            "rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
            "original_max_position_embeddings": 32}},
        {"markov_head_type": "rnn"}, {}),
    # no Markov head, no confidence head, swish, dynamic RoPE below its length
    "no_heads_swish_dynamic": (
        {"hidden_act": "swish", "max_position_embeddings": 8192, "rope_parameters": {
            "rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}},
        {"markov_rank": 0, "confidence_head_alpha": 0.0}, {}),
    # a confidence head without the Markov feature, tanh GELU, a partial rotary factor and
    # an unused key that Qwen3's default RoPE ignores
    "partial_rotary_tanh_gelu": (
        {"hidden_act": "gelu_pytorch_tanh", "rope_parameters": {
            "rope_type": "default", "rope_theta": 3e4, "partial_rotary_factor": 0.25,
            "factor": 2.0}},
        {"confidence_head_with_markov": False}, {}),
}



def make_model(target: dict, args: dict, after: dict) -> Qwen3DSparkModel:
    config = build_draft_config(
        Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                    num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=8, **target),
        Args({"num_draft_layers": 2, "target_layer_ids": [1, 3, 6], "block_size": BLOCK,
              "mask_token_id": MASK, "num_anchors": 16, "markov_rank": 16,
              "markov_head_type": "vanilla", "confidence_head_alpha": 1.0,
              "confidence_head_with_markov": True, **args}))
    for key, value in after.items():
        setattr(config, key, value)
    config._attn_implementation = "eager"
    model = Qwen3DSparkModel(config)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            elif p.dim() == 1 or name in ("embed_tokens.weight", "markov_head.markov_w1.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * (0.1 if p.dim() == 1 else 1))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)
    return model.eval()


@torch.no_grad()
def rounds(model: Qwen3DSparkModel, sizes: tuple[int, ...] = (12, 3, 5)
           ) -> dict[str, torch.Tensor]:
    """Rounds of ``sizes`` new feature rows (a prompt, then accepted + 1 rows)."""
    gen = torch.Generator().manual_seed(1)
    width = 3 * model.config.hidden_size
    cache, record, start = DynamicCache(), {}, 0
    for i, new in enumerate(sizes):
        features = torch.randn(1, new, width, generator=gen)
        start += new
        anchor = int(torch.randint(0, MASK, (1,), generator=gen))
        ids = torch.tensor([[anchor] + [MASK] * (BLOCK - 1)])
        hidden = forward_dspark_draft_block(
            model, draft_input_ids=ids, position_ids=torch.arange(start + BLOCK)[None],
            past_key_values_draft=cache, target_hidden_states=features, start=start,
            block_size=BLOCK)
        proposal = build_dspark_proposal(model, draft_input_ids=ids, block_hidden=hidden,
                                         block_size=BLOCK, temperature=0.0,
                                         confidence_threshold=0.0)
        record.update({f"features{i}": features[0], f"anchor{i}": torch.tensor(anchor),
                       f"anchor_pos{i}": torch.tensor(start), f"hidden{i}": hidden[0],
                       f"ids{i}": proposal.verify_input_ids[0, 1:]})
        if proposal.confidence_logits is not None:
            record[f"confidence_logits{i}"] = proposal.confidence_logits[0]
    return record


def make(variant: tuple, directory: Path, reference: Path, sizes: tuple[int, ...]) -> None:
    make_model(*variant).save_pretrained(directory)
    loaded = Qwen3DSparkModel.from_pretrained(str(directory), attn_implementation="eager")
    save_file(rounds(loaded.eval(), sizes), str(reference))
    print(f"wrote {directory} and {reference}")


if __name__ == "__main__":
    make(FIXTURE, HERE / "checkpoint", HERE / "reference.safetensors", (12, 3))
    for name, variant in VARIANTS.items():
        make(variant, VARIANTS_DIR / name, VARIANTS_DIR / name / "reference.safetensors",
             (12, 3, 5))
