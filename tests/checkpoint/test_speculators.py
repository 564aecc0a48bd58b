"""speculators-format checkpoints written by the speculators package itself load with the
meaning speculators gives them: the drafter drafts what speculators' own forward drafts.
Each non-default field is also removed once, and the drafter must then draft something
else (or be refused), so each comparison can fail."""

import json
import subprocess
import sys

import pytest
import torch
from transformers import LlamaConfig
from speculators_reference import (edit_config, load_reference, reference_draft,
                                   write_checkpoint, write_verifier)

from dspark_compile.checkpoint import load_checkpoint, save_checkpoint
from dspark_compile.config import lane_config
from dspark_compile.draft import KVCache, RoundInputs, draft
from dspark_compile.errors import CheckpointError

pytest.importorskip("speculators", reason="the speculators package is the format's reference "
                    "(pip install --no-deps speculators==0.9.0)")

CASES = {
    # full vocabulary, scaled RoPE, every layer full attention, drafts from the anchor
    "full vocab, linear rope": dict(layers=dict(rope_parameters={
        "rope_type": "linear", "rope_theta": 1e5, "factor": 2.0})),
    # reduced vocabulary, one sliding (causal) layer, the 1+k layout, a gated head
    "d2t, sliding causal, 1+k": dict(
        layers=dict(layer_types=["sliding_attention", "full_attention"], sliding_window=8,
                    use_sliding_window=True, rope_parameters={"rope_type": "default",
                                                              "rope_theta": 3e4}),
        draft_vocab=128, sample_from_anchor=False, markov_head_type="gated", block_size=6),
    # the embedding tap, biases, GELU, a bidirectional sliding layer, the rnn head
    "tap -1, bias, gelu, non-causal window, rnn": dict(
        layers=dict(layer_types=["full_attention", "sliding_attention"], sliding_window=5,
                    use_sliding_window=True, attention_bias=True,
                    hidden_act="gelu_pytorch_tanh"),
        aux=(0, 2, 4), sliding_window_non_causal=True, markov_head_type="rnn"),
    # the rnn head in the 1+k layout: the anchor's slot runs the recurrence first
    "rnn, 1+k": dict(layers={}, sample_from_anchor=False, markov_head_type="rnn"),
    # Llama layer configs (speculators' trainer copies a Llama target's): Qwen3 layers
    # configured by LlamaConfig, its defaults (head_dim from hidden_size) and biases
    "llama layers": dict(layers=dict(head_dim=None, attention_bias=True, mlp_bias=True,
                                     rope_parameters={"rope_type": "llama3", "rope_theta": 5e5,
                                                      "factor": 8.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0,
                                                      "original_max_position_embeddings": 64}),
                         config_class=LlamaConfig, markov_head_type="gated"),
    # no Markov head (the base argmax), no confidence head
    "no markov head": dict(layers={}, markov_rank=0, confidence_head_with_markov=False),
    "no confidence head": dict(layers={}, enable_confidence_head=False, draft_vocab=128),
    # per-layer-type RoPE (speculators takes the sliding entry), keys a type ignores, a
    # partial rotary factor the Qwen3 layers' default RoPE ignores, swish
    "nested rope, ignored keys, swish": dict(
        layers=dict(hidden_act="swish", rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "linear", "rope_theta": 2e4, "factor": 3.0,
                                  "beta_fast": 4}})),
    "partial rotary, gelu_new, dynamic": dict(
        layers=dict(hidden_act="gelu_new", max_position_embeddings=8192, rope_parameters={
            "rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0})),
    "partial rotary (default rope)": dict(
        layers=dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                     "partial_rotary_factor": 0.25})),
}
# per case: config fields whose removal must change what is drafted ("tl." = under
# transformer_layer_config)
REMOVED = {
    "full vocab, linear rope": ["tl.rope_parameters", "aux_hidden_state_layer_ids"],
    "d2t, sliding causal, 1+k": ["tl.layer_types", "sample_from_anchor", "tl.rope_parameters"],
    "tap -1, bias, gelu, non-causal window, rnn": [
        "sliding_window_non_causal", "tl.hidden_act", "tl.attention_bias", "markov_head_type"],
    "rnn, 1+k": ["sample_from_anchor"],
    "llama layers": ["tl.rope_parameters", "tl.attention_bias"],
    "no markov head": ["markov_rank"],
    "nested rope, ignored keys, swish": ["tl.rope_parameters"],
}
ANCHORS = (9, 14, 30)  # rounds of one request: inside the windows, then past them


@pytest.fixture(scope="module")
def verifier(tmp_path_factory):
    return write_verifier(tmp_path_factory.mktemp("verifier"))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, verifier):
    """name -> (checkpoint directory, speculators' own model of it)."""
    made = {}
    for i, (name, case) in enumerate(CASES.items()):
        path = write_checkpoint(tmp_path_factory.mktemp(f"case{i}"), verifier, seed=i, **case)
        made[name] = path, load_reference(path)
    return made


def seeded_sequence(seed: int, width: int):
    gen = torch.Generator().manual_seed(seed)
    length = max(ANCHORS) + 10
    return torch.randn(length, width, generator=gen), torch.randint(0, 500, (length,),
                                                                     generator=gen)


@torch.no_grad()
def our_rounds(drafter, features, ids):
    """One request's rounds at :data:`ANCHORS`, each appending the context rows since the
    last: h, U (from the block alone) and the draft step's ids and confidences."""
    lane, start = drafter.lane, 0
    cache, plain = KVCache.allocate(lane, 1, "cpu"), KVCache.allocate(lane, 1, "cpu")
    for anchor in ANCHORS:
        inputs = RoundInputs(features[None, start:anchor], torch.tensor([anchor - start]),
                             ids[anchor:anchor + 1], torch.tensor([anchor]))
        h, base, _ = drafter.block(plain.k, plain.v, inputs.anchor, inputs.anchor_pos,
                                   inputs.features, inputs.num_new)
        out = draft(drafter, cache, inputs)
        start = anchor
        yield h[0], base[0], out.ids[0], None if out.confidences is None else out.confidences[0]


def drafts_like_reference(drafter, model) -> bool:
    features, ids = seeded_sequence(1, drafter.lane.feature_size)
    for anchor, mine in zip(ANCHORS, our_rounds(drafter, features, ids)):
        ref = reference_draft(model, features, ids, anchor)
        if mine[0].shape != ref[0].shape or (mine[3] is None) != (ref[3] is None):
            return False
        close = [torch.allclose(a, b, rtol=1e-4, atol=1e-4)
                 for a, b in zip(mine, ref) if a is not None]
        if not (all(close) and torch.equal(mine[2], ref[2])):
            return False
    return True


def assert_drafts_like_reference(drafter, model):
    features, ids = seeded_sequence(1, drafter.lane.feature_size)
    for anchor, (h, base, drafted, confidences) in zip(ANCHORS, our_rounds(drafter, features,
                                                                          ids)):
        h_ref, base_ref, drafted_ref, confidences_ref = reference_draft(model, features, ids,
                                                                        anchor)
        torch.testing.assert_close(h, h_ref, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(base, base_ref, rtol=1e-4, atol=1e-4)
        assert torch.equal(drafted, drafted_ref), anchor
        if confidences_ref is None:
            assert confidences is None
        else:
            torch.testing.assert_close(confidences, confidences_ref, rtol=1e-5, atol=1e-6)


def load(path, verifier):
    return load_checkpoint(path, lane_config("tiny", dtype="float32"), "cpu", verifier=verifier)


@pytest.mark.parametrize("name", CASES)
def test_a_speculators_checkpoint_drafts_what_speculators_drafts(checkpoints, verifier, name):
    path, model = checkpoints[name]
    assert_drafts_like_reference(load(path, verifier), model)


@pytest.mark.parametrize("name,field", [(n, f) for n, fields in REMOVED.items() for f in fields])
def test_without_the_field_the_checkpoint_drafts_something_else(checkpoints, verifier,
                                                               tmp_path, name, field):
    path, model = checkpoints[name]
    for item in path.iterdir():
        (tmp_path / item.name).write_bytes(item.read_bytes())

    def remove(config):
        inner = config["transformer_layer_config"] if field.startswith("tl.") else config
        del inner[field.removeprefix("tl.")]
    edit_config(tmp_path, remove)
    try:
        drafter = load(tmp_path, verifier)
    except CheckpointError:
        return  # refused by name is not drafting silently wrong
    assert not drafts_like_reference(drafter, model)


def test_without_verifier_the_one_its_config_names_is_read(checkpoints):
    path, model = checkpoints["full vocab, linear rope"]  # it names a local directory
    assert_drafts_like_reference(load_checkpoint(path, lane_config("tiny", dtype="float32"),
                                                 "cpu"), model)


@pytest.mark.parametrize("named", [None, "org/some-target-on-a-hub"])
def test_a_verifier_that_is_not_a_local_directory_asks_for_one(checkpoints, tmp_path, named):
    path, _ = checkpoints["full vocab, linear rope"]
    for item in path.iterdir():
        (tmp_path / item.name).write_bytes(item.read_bytes())
    edit_config(tmp_path, lambda c: c["speculators_config"]["verifier"].update(
        name_or_path=named))
    with pytest.raises(CheckpointError, match=r"not a local directory.*verifier=DIR.*"
                       r"embed_tokens.weight', 'lm_head.weight'" if named else
                       r"names no verifier.*verifier=DIR"):
        load_checkpoint(tmp_path, lane_config("tiny"), "cpu")


@pytest.mark.parametrize("keys", [
    ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"],
    ["embed_tokens.weight", "model.layers.0.mlp.up_proj.weight"],
    ["tok_embeddings.weight", "output.weight"],
    ["model.tok_embeddings.weight", "model.output.weight", "layers.0.output.weight"],
    ["llm.embed.weight", "llm.unembed.weight"],
    ["backbone.embeddings.weight", "lm_head.weight", "model.embed_tokens.weight"],
])
def test_verifier_names_resolve_as_speculators_resolves_them(tmp_path, keys):
    """Our resolution against speculators' own (``_resolve_key``) on each key set, and the
    tensors read: a target without an lm_head ties it to its embeddings."""
    from safetensors.torch import save_file
    from speculators.utils.loading import _resolve_key

    from dspark_compile.checkpoint.verifier import EMBED, LM_HEAD, verifier_tensors

    tensors = {key: torch.full((4, 2), float(i)) for i, key in enumerate(keys)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    got = verifier_tensors(tmp_path, [EMBED, LM_HEAD])
    weight_map = dict.fromkeys(keys, "model.safetensors")
    embed = _resolve_key(EMBED, weight_map)
    head = _resolve_key(LM_HEAD, weight_map) or embed
    assert torch.equal(got[EMBED], tensors[embed])
    assert torch.equal(got[LM_HEAD], tensors[head])


def test_the_loaded_lane_says_where_each_field_came_from(checkpoints, verifier):
    drafter = load(checkpoints["d2t, sliding causal, 1+k"][0], verifier)
    sources = drafter.sources
    assert sources["layer_types"] == "config.json transformer_layer_config.layer_types"
    assert sources["k"] == "config.json block_size"
    assert sources["dtype"] == "lane 'tiny'" and sources["max_context"] == "lane 'tiny'"
    assert set(sources) == set(drafter.lane.to_dict())


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("with_verifier", [True, False])
def test_our_save_loads_in_speculators_with_the_same_meaning(checkpoints, verifier, tmp_path,
                                                            name, with_verifier):
    path, model = checkpoints[name]
    drafter = load(path, verifier)
    save_checkpoint(drafter, tmp_path, "speculators", verifier if with_verifier else None)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == (
        str(verifier) if with_verifier else None)
    reloaded = load_reference(tmp_path)
    original, again = model.state_dict(), reloaded.state_dict()
    assert original.keys() == again.keys()
    for key in original:
        if not key.startswith("verifier_"):  # training targets, not the drafter's
            assert torch.equal(original[key], again[key]), key
    for key in ("block_size", "sample_from_anchor", "aux_hidden_state_layer_ids",
                "sliding_window_non_causal", "markov_head_type", "draft_vocab_size"):
        assert getattr(reloaded.config, key) == getattr(model.config, key), key
    assert reloaded.sliding_window_indices == model.sliding_window_indices
    assert reloaded.sliding_window == model.sliding_window
    assert drafts_like_reference(drafter, reloaded)


def test_the_main_command_loads_it_with_its_verifier(checkpoints, verifier, tmp_path):
    path, _ = checkpoints["d2t, sliding causal, 1+k"]
    result = subprocess.run(
        [sys.executable, "-m", "dspark_compile", "backend=eager", "buckets=[3]",
         f"checkpoint={path}", f"verifier={verifier}", f"artifacts_dir={tmp_path}"],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    line = next(s for s in result.stdout.splitlines() if s.startswith(f"checkpoint {path}: "))
    assert "from config.json: " in line and "layer_types" in line
    assert "from lane 'tiny': " in line and "dtype" in line
