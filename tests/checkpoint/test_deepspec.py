"""DeepSpec-format checkpoints against DeepSpec's own code: the fixture in deepspec_tiny/
was made, saved and drafted by DeepSpec (make.py there says how), so a load with the wrong
meaning drafts other tokens than DeepSpec did. Its config carries a linear-scaled RoPE at
theta 5e5, the embedding tap -1, and a sliding window DeepSpec never applies (its drafter
attends every layer in full)."""

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dspark_compile.checkpoint import load_checkpoint, save_checkpoint
from dspark_compile.config import lane_config
from dspark_compile.draft import KVCache, RoundInputs, draft
from dspark_compile.errors import CheckpointError

FIXTURE = Path(__file__).parent / "deepspec_tiny"
CHECKPOINT = FIXTURE / "checkpoint"
# made by DeepSpec too (deepspec_tiny/make.py): every Markov head and none, no
# confidence head, llama3 / yarn / dynamic / partial-rotary RoPE, four activations, tied
# embeddings in the config, sliding layer types
VARIANTS = Path(__file__).parent / "deepspec_variants"


def reference(fixture=FIXTURE):
    return load_file(str(fixture / "reference.safetensors"))


def load(path=CHECKPOINT):
    return load_checkpoint(path, lane_config("tiny", dtype="float32"), "cpu")


@torch.no_grad()
def our_rounds(drafter, ref=None):
    """The fixture's rounds through the eager draft step: h, ids, confidences."""
    ref, lane = reference() if ref is None else ref, drafter.lane
    cache, plain = KVCache.allocate(lane, 1, "cpu"), KVCache.allocate(lane, 1, "cpu")
    for i in range(sum(key.startswith("ids") for key in ref)):
        features = ref[f"features{i}"][None]
        args = (features, torch.tensor([features.shape[1]]), ref[f"anchor{i}"][None],
                ref[f"anchor_pos{i}"][None])
        drafter.append_context(plain.k, plain.v, *args[:2], args[3])
        h, _ = drafter(plain.k, plain.v, args[2], args[3])
        out = draft(drafter, cache, RoundInputs(*args))
        yield h[0], out.ids[0], None if out.confidences is None else out.confidences[0]


def test_the_fixture_drafts_what_deepspec_drafted():
    ref = reference()
    for i, (h, ids, confidences) in enumerate(our_rounds(load())):
        torch.testing.assert_close(h, ref[f"hidden{i}"], rtol=1e-5, atol=1e-5)
        assert torch.equal(ids, ref[f"ids{i}"]), i
        torch.testing.assert_close(confidences, torch.sigmoid(ref[f"confidence_logits{i}"]),
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(p.name for p in VARIANTS.iterdir() if p.is_dir()))
def test_each_variant_drafts_what_deepspec_drafted(name):
    ref, drafter = reference(VARIANTS / name), load(VARIANTS / name)
    for i, (h, ids, confidences) in enumerate(our_rounds(drafter, ref)):
        torch.testing.assert_close(h, ref[f"hidden{i}"], rtol=1e-5, atol=1e-5)
        assert torch.equal(ids, ref[f"ids{i}"]), i
        if f"confidence_logits{i}" in ref:
            torch.testing.assert_close(confidences, torch.sigmoid(ref[f"confidence_logits{i}"]),
                                       rtol=1e-5, atol=1e-6)
        else:
            assert confidences is None and drafter.confidence_head is None


def test_the_variants_say_what_deepspec_ignores():
    sources = load(VARIANTS / "gated_llama3_tied_sliding").sources
    assert "ignores the 1 sliding layers" in sources["layer_types"]
    sources = load(VARIANTS / "partial_rotary_tanh_gelu").sources
    assert "partial_rotary_factor=0.25 ignored" in sources["rope_scaling"]
    assert "factor ignored" in sources["rope_scaling"]


def test_without_its_rope_the_fixture_drafts_something_else(tmp_path):
    shutil.copytree(CHECKPOINT, tmp_path, dirs_exist_ok=True)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["rope_parameters"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    ref = reference()
    drafted = [(h, ids) for h, ids, _ in our_rounds(load(tmp_path))]
    assert any(not torch.allclose(h, ref[f"hidden{i}"], atol=1e-3)
               for i, (h, _) in enumerate(drafted))
    assert any(not torch.equal(ids, ref[f"ids{i}"]) for i, (_, ids) in enumerate(drafted))


@pytest.mark.parametrize("field", ["target_layer_ids", "block_size", "mask_token_id",
                                   "markov_rank", "markov_head_type", "enable_confidence_head",
                                   "confidence_head_with_markov"])
def test_a_field_deepspec_requires_is_required_by_name(tmp_path, field):
    shutil.copytree(CHECKPOINT, tmp_path, dirs_exist_ok=True)
    config = json.loads((tmp_path / "config.json").read_text())
    del config[field]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=field):
        load(tmp_path)


def test_the_loaded_lane_names_its_sources():
    sources = load().sources
    assert sources["rope_scaling"] == "config.json rope_parameters"
    assert sources["target_layer_ids"] == "config.json target_layer_ids"
    assert sources["layer_types"].startswith("DeepSpec: every layer full_attention")
    assert sources["dtype"] == "lane 'tiny'"


def test_our_save_writes_what_deepspec_wrote(tmp_path):
    """Every field DeepSpec's own save wrote that changes the draft step, and the same
    tensors under the same names."""
    save_checkpoint(load(), tmp_path, "deepspec")
    theirs = json.loads((CHECKPOINT / "config.json").read_text())
    ours = json.loads((tmp_path / "config.json").read_text())
    for key in ("architectures", "model_type", "hidden_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                "vocab_size", "rms_norm_eps", "hidden_act", "attention_bias", "rope_parameters",
                "tie_word_embeddings", "block_size", "mask_token_id", "target_layer_ids",
                "markov_rank", "markov_head_type", "enable_confidence_head",
                "confidence_head_with_markov", "layer_types"):
        assert ours[key] == theirs[key], key
    assert "num_anchors" in ours  # DeepSpec's from_pretrained asserts it
    assert not ours["use_sliding_window"]
    mine, original = load_file(str(tmp_path / "model.safetensors")), load_file(
        str(CHECKPOINT / "model.safetensors"))
    assert mine.keys() == original.keys()
    for key in mine:
        assert torch.equal(mine[key], original[key]), key


DEEPSPEC = os.environ.get("DEEPSPEC_SRC")


@pytest.mark.skipif(not DEEPSPEC, reason="DeepSpec is not on PyPI: DEEPSPEC_SRC=<checkout> "
                    "with DeepSpec's transformers (5.10) runs DeepSpec itself on our save")
@pytest.mark.parametrize("fixture,checkpoint", [(FIXTURE, CHECKPOINT)] + [
    (VARIANTS / name, VARIANTS / name) for name in sorted(
        p.name for p in VARIANTS.iterdir() if p.is_dir())])
def test_deepspec_loads_our_save_and_drafts_the_same(tmp_path, fixture, checkpoint):
    sys.path[:0] = [DEEPSPEC, str(FIXTURE)]
    from deepspec.modeling.dspark.qwen3.modeling import Qwen3DSparkModel
    from make import rounds

    save_checkpoint(load(checkpoint), tmp_path, "deepspec")
    model = Qwen3DSparkModel.from_pretrained(str(tmp_path), attn_implementation="eager")
    original = load_file(str(checkpoint / "model.safetensors"))
    state = model.state_dict()
    assert state.keys() == original.keys()
    for key in original:
        assert torch.equal(state[key], original[key]), key
    ref = reference(fixture)
    count = sum(key.startswith("ids") for key in ref)
    drafted = rounds(model.float().eval(), (12, 3, 5)[:count])
    for i in range(count):
        assert torch.equal(drafted[f"ids{i}"], ref[f"ids{i}"]), i
