"""speculators-format checkpoints written by the speculators package itself load with the
meaning speculators gives them: the drafter drafts what speculators' own forward drafts.
Each non-default field is also removed once, and the drafter must then draft something
else (or be refused), so each comparison can fail."""

import json
import subprocess
import sys

import pytest
import torch
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
}
# per case: config fields whose removal must change what is drafted ("tl." = under
# transformer_layer_config)
REMOVED = {
    "full vocab, linear rope": ["tl.rope_parameters", "aux_hidden_state_layer_ids"],
    "d2t, sliding causal, 1+k": ["tl.layer_types", "sample_from_anchor", "tl.rope_parameters"],
    "tap -1, bias, gelu, non-causal window, rnn": [
        "sliding_window_non_causal", "tl.hidden_act", "tl.attention_bias", "markov_head_type"],
}
ANCHORS = (9, 30)  # one inside the windows, one past them


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
def our_draft(drafter, features, ids, anchor):
    lane = drafter.lane
    args = (features[None, :anchor], torch.tensor([anchor]), ids[anchor:anchor + 1],
            torch.tensor([anchor]))
    cache = KVCache.allocate(lane, 1, "cpu")
    drafter.append_context(cache.k, cache.v, *args[:2], args[3])
    h, base = drafter(cache.k, cache.v, args[2], args[3])
    out = draft(drafter, KVCache.allocate(lane, 1, "cpu"), RoundInputs(*args))
    return h[0], base[0], out.ids[0], out.confidences[0]


def drafts_like_reference(drafter, model) -> bool:
    features, ids = seeded_sequence(1, drafter.lane.feature_size)
    for anchor in ANCHORS:
        mine = our_draft(drafter, features, ids, anchor)
        ref = reference_draft(model, features, ids, anchor)
        if mine[0].shape != ref[0].shape:
            return False
        close = [torch.allclose(a, b, rtol=1e-4, atol=1e-4) for a, b in zip(mine, ref)]
        if not (all(close) and torch.equal(mine[2], ref[2])):
            return False
    return True


def load(path, verifier):
    return load_checkpoint(path, lane_config("tiny", dtype="float32"), "cpu", verifier=verifier)


@pytest.mark.parametrize("name", CASES)
def test_a_speculators_checkpoint_drafts_what_speculators_drafts(checkpoints, verifier, name):
    path, model = checkpoints[name]
    drafter = load(path, verifier)
    features, ids = seeded_sequence(1, drafter.lane.feature_size)
    for anchor in ANCHORS:
        h, base, drafted, confidences = our_draft(drafter, features, ids, anchor)
        h_ref, base_ref, drafted_ref, confidences_ref = reference_draft(model, features, ids,
                                                                        anchor)
        torch.testing.assert_close(h, h_ref, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(base, base_ref, rtol=1e-4, atol=1e-4)
        assert torch.equal(drafted, drafted_ref), anchor
        torch.testing.assert_close(confidences, confidences_ref, rtol=1e-5, atol=1e-6)


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


def test_the_tensors_left_to_the_verifier_are_named_when_it_is_missing(checkpoints):
    path, _ = checkpoints["full vocab, linear rope"]
    with pytest.raises(CheckpointError, match=r"embed_tokens.weight', 'lm_head.weight'.*"
                                              "verifier=DIR"):
        load_checkpoint(path, lane_config("tiny"), "cpu")


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
