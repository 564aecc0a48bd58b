import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from dspark_compile.checkpoint import (CONFIG, CHECKPOINT_WEIGHTS, Format, empty_drafter,
                                       load_checkpoint, load_weights, meta_drafter,
                                       random_drafter, save_checkpoint)
from dspark_compile.config import lane_config
from dspark_compile.errors import CheckpointError


def assert_same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


def deepspec_keys(layers, head="vanilla"):
    """The DeepSpec-native key list (Qwen3DSparkModel's state dict), written out by hand."""
    keys = {"embed_tokens.weight", "fc.weight", "hidden_norm.weight", "norm.weight",
            "lm_head.weight", "markov_head.markov_w1.weight", "markov_head.markov_w2.weight",
            "confidence_head.proj.weight", "confidence_head.proj.bias"}
    for i in range(layers):
        keys |= {f"layers.{i}.self_attn.{p}_proj.weight" for p in "qkvo"}
        keys |= {f"layers.{i}.self_attn.{p}_norm.weight" for p in "qk"}
        keys |= {f"layers.{i}.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
        keys |= {f"layers.{i}.{n}_layernorm.weight" for n in ("input", "post_attention")}
    extra = {"gated": "gate_proj", "rnn": "joint_proj"}.get(head)
    if extra:
        keys |= {f"markov_head.{extra}.weight", f"markov_head.{extra}.bias"}
    return keys


@pytest.mark.parametrize("head", ["vanilla", "gated", "rnn"])
def test_deepspec_round_trip_and_key_layout(tmp_path, head):
    lane = lane_config("tiny", markov_head=head)
    drafter = random_drafter(lane, "cpu", seed=5)
    save_checkpoint(drafter, tmp_path, Format.deepspec)
    with safe_open(str(tmp_path / CHECKPOINT_WEIGHTS), framework="pt") as f:
        assert set(f.keys()) == deepspec_keys(lane.num_layers, head)
        assert list(f.get_slice("markov_head.markov_w2.weight").get_shape()) == [
            lane.draft_vocab_size, lane.markov_rank]
    config = json.loads((tmp_path / CONFIG).read_text())
    assert config["target_layer_ids"] == lane.target_layer_ids
    assert config["markov_head_type"] == head and config["block_size"] == lane.k
    loaded = load_checkpoint(tmp_path, lane_config("tiny"), "cpu")
    assert loaded.lane == drafter.lane.replace(name=tmp_path.name)  # named after the folder
    assert_same_weights(drafter, loaded)


def test_speculators_round_trip_keeps_d2t(tmp_path):
    lane = lane_config("tiny_d2t", layout="one_plus_k", sliding_window=32,
                       layer_types=["full_attention", "sliding_attention"])
    drafter = random_drafter(lane, "cpu", seed=6)
    save_checkpoint(drafter, tmp_path, Format.speculators)
    config = json.loads((tmp_path / CONFIG).read_text())
    assert config["aux_hidden_state_layer_ids"] == [i + 1 for i in lane.target_layer_ids]
    assert config["draft_vocab_size"] == 128 and config["sample_from_anchor"] is False
    assert config["transformer_layer_config"]["vocab_size"] == 512
    tensors = load_file(str(tmp_path / CHECKPOINT_WEIGHTS))
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert int(tensors["t2d"].sum()) == lane.draft_vocab_size
    loaded = load_checkpoint(tmp_path, lane_config("tiny"), "cpu")
    assert loaded.lane == drafter.lane.replace(name=tmp_path.name)  # the geometry: config.json
    assert_same_weights(drafter, loaded)


def test_checkpoint_config_overrides_lane_geometry(tmp_path):
    saved = lane_config("tiny", markov_rank=8, k=3, num_layers=1)
    save_checkpoint(random_drafter(saved, "cpu"), tmp_path)
    loaded = load_checkpoint(tmp_path, lane_config("tiny"), "cpu")
    assert (loaded.lane.markov_rank, loaded.lane.k, loaded.lane.num_layers) == (8, 3, 1)


def test_reduced_vocabulary_needs_the_speculators_format(tmp_path):
    with pytest.raises(CheckpointError, match="only the speculators format"):
        save_checkpoint(random_drafter(lane_config("tiny_d2t"), "cpu"), tmp_path, "deepspec")


def rewrite_weights(path, change):
    tensors = load_file(str(path / CHECKPOINT_WEIGHTS))
    change(tensors)
    save_file(tensors, str(path / CHECKPOINT_WEIGHTS))


def test_shape_mismatch_names_key_and_both_shapes(tmp_path):
    save_checkpoint(random_drafter(lane_config("tiny"), "cpu"), tmp_path)
    rewrite_weights(tmp_path, lambda t: t.update(
        {"layers.1.mlp.up_proj.weight": torch.zeros(100, 64, dtype=torch.bfloat16)}))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path, lane_config("tiny"), "cpu")
    message = str(info.value)
    assert "layers.1.mlp.up_proj.weight" in message
    assert "[100, 64]" in message and "[128, 64]" in message


def test_missing_and_unexpected_keys_are_named(tmp_path):
    save_checkpoint(random_drafter(lane_config("tiny"), "cpu"), tmp_path)

    def change(t):
        del t["fc.weight"]
        t["extra.weight"] = torch.zeros(1)
    rewrite_weights(tmp_path, change)
    with pytest.raises(CheckpointError, match=r"missing \['fc.weight'\], unexpected "
                                              r"\['extra.weight'\]"):
        load_checkpoint(tmp_path, lane_config("tiny"), "cpu")


@pytest.mark.parametrize("damage", ["truncate", "garble_config", "drop_key"])
def test_damaged_checkpoints_raise_checkpoint_error(tmp_path, damage):
    save_checkpoint(random_drafter(lane_config("tiny"), "cpu"), tmp_path)
    if damage == "truncate":
        data = (tmp_path / CHECKPOINT_WEIGHTS).read_bytes()
        (tmp_path / CHECKPOINT_WEIGHTS).write_bytes(data[: len(data) // 2])
    elif damage == "garble_config":
        (tmp_path / CONFIG).write_text("{not json")
    else:
        config = json.loads((tmp_path / CONFIG).read_text())
        del config["markov_rank"]
        (tmp_path / CONFIG).write_text(json.dumps(config))
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path, lane_config("tiny"), "cpu")


def test_random_weights_are_seeded_and_made_on_the_device_in_the_lane_dtype(device):
    lane = lane_config("tiny_d2t")
    a, b = random_drafter(lane, device, 1), random_drafter(lane, device, 1)
    assert_same_weights(a, b)
    c = random_drafter(lane, device, 2)
    assert not torch.equal(a.fc.weight, c.fc.weight)
    for name, t in a.state_dict().items():
        assert t.device.type == device.type, name
        assert t.dtype == (torch.int64 if name == "d2t" else torch.bfloat16), name
    targets = torch.arange(lane.draft_vocab_size, device=device) + a.d2t
    assert torch.all(targets[1:] > targets[:-1]) and int(targets.max()) < 512


def test_weights_fill_a_drafter_made_without_storage_whose_modules_are_held(tmp_path, device):
    lane = lane_config("tiny_d2t")
    path = tmp_path / "weights.safetensors"
    save_file(random_drafter(lane, "cpu", 3).state_dict(), path)
    drafter = meta_drafter(lane, device)
    held = drafter.layers[0].self_attn  # as a loaded compiled step holds its modules
    assert held.qkv_proj.weight.is_meta
    assert load_weights(lane, path, device, into=drafter) is drafter
    written = load_file(path)  # safetensors' own reader
    for name, t in drafter.state_dict().items():
        assert not t.is_meta and t.device.type == device.type, name
        assert torch.equal(t.cpu(), written[name]), name
    assert held is drafter.layers[0].self_attn and held.qkv_proj.weight.device.type == device.type
    assert torch.equal(drafter.rope_cos, empty_drafter(lane, device).rope_cos)


class Files(dict):
    def __repr__(self):  # hypothesis prints its arguments on failure: keep it short
        return f"Files({sorted(self)})"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path = tmp_path_factory.mktemp("pristine")
    save_checkpoint(random_drafter(lane_config("tiny_d2t"), "cpu", seed=3), path, "speculators")
    return Files({name: (path / name).read_bytes() for name in (CONFIG, CHECKPOINT_WEIGHTS)})


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-10**12, 10**12)
                           | st.floats(allow_nan=True) | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3), max_leaves=6)


# derandomized: the same 60 cases every run, so CI is not a lottery; `--hypothesis-seed=N`
# with derandomize off explores others
@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_checkpoints_load_or_raise_checkpoint_error(pristine, tmp_path, data):
    weights, config = pristine[CHECKPOINT_WEIGHTS], json.loads(pristine[CONFIG])
    damage = data.draw(st.sampled_from(["truncate", "flip", "field", "json"]))
    if damage == "truncate":
        weights = weights[:data.draw(st.integers(0, len(weights) - 1))]
    if damage == "flip":
        at = data.draw(st.integers(0, min(len(weights) - 1, 4096)))  # header and first bytes
        weights = weights[:at] + bytes([weights[at] ^ 0xFF]) + weights[at + 1:]
    key = None
    if damage == "field":
        key = data.draw(st.sampled_from(sorted(config)))
        config[key] = data.draw(JSON_VALUES)
    text = json.dumps(config)
    if damage == "json":
        text = text[:data.draw(st.integers(0, len(text) - 1))]
    (tmp_path / CHECKPOINT_WEIGHTS).write_bytes(weights)
    (tmp_path / CONFIG).write_text(text)
    if damage in ("truncate", "json"):  # never a checkpoint: refused by name, every time
        with pytest.raises(CheckpointError, match=CHECKPOINT_WEIGHTS if damage == "truncate"
                           else CONFIG):
            load_checkpoint(tmp_path, lane_config("tiny"), "cpu")
        return
    try:
        drafter = load_checkpoint(tmp_path, lane_config("tiny"), "cpu")
    except CheckpointError as err:
        assert "\n" not in str(err) and str(tmp_path) in str(err)  # one line, the file named
        return
    # it loaded: what it holds is the file's, and a changed field reads as written
    assert drafter.fc.weight.device.type == "cpu"
    if damage == "field" and key in ("block_size", "mask_token_id", "draft_vocab_size"):
        field = {"block_size": "k", "mask_token_id": "mask_token_id",
                 "draft_vocab_size": "draft_vocab_size"}[key]
        assert getattr(drafter.lane, field) == config[key]
