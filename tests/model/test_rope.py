"""RoPE read from a config.json against transformers' own Qwen3RotaryEmbedding built from
the same config.json: the theta's place (rope_parameters, rope_scaling, top level, the
default) and every scaling type the draft step supports."""

import pytest
import torch
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

from dspark_compile.checkpoint.fields import Reading, read_rope
from dspark_compile.errors import CheckpointError
from dspark_compile.model.rope import rope_tables

HEAD_DIM, POSITIONS = 16, 3000
BASE = {"hidden_size": 64, "num_attention_heads": 4, "head_dim": HEAD_DIM,
        "max_position_embeddings": 4096}
CONFIGS = {
    "default theta": {},
    "old top-level theta": {"rope_theta": 5e5},
    "rope_parameters theta": {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
    "old rope_scaling linear": {"rope_theta": 1e6, "rope_scaling": {"type": "linear",
                                                                    "factor": 4.0}},
    "linear": {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e6, "factor": 2.5}},
    "llama3": {"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0,
                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 256}},
    "yarn": {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                                 "original_max_position_embeddings": 1024}},
    "yarn, implied factor and original length": {
        "max_position_embeddings": 8192, "original_max_position_embeddings": 2048,
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": None}},
    # below max_position_embeddings, transformers' dynamic RoPE keeps the plain frequencies
    "dynamic": {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e5, "factor": 4.0}},
    # keys a type does not use: transformers warns and ignores them
    "linear, an unused key": {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e6,
                                                  "factor": 2.0, "low_freq_factor": 1.0}},
    "default, unused keys": {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                 "factor": 3.0, "beta_fast": 8}},
    # Qwen3's default RoPE rotates every dimension whatever the factor says
    "default, partial rotary": {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                    "partial_rotary_factor": 0.25}},
    "default, top-level partial rotary": {"partial_rotary_factor": 0.5,
                                          "rope_parameters": {"rope_type": "default"}},
    "yarn, mscale and untruncated": {
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 16.0,
                            "mscale": 0.707, "mscale_all_dim": 1.0, "truncate": False,
                            "beta_fast": 16, "original_max_position_embeddings": 512}},
}


def ours(config):
    r = Reading(config, "test")
    read_rope(r)
    return rope_tables(POSITIONS, HEAD_DIM, r.fields["rope_theta"], r.fields["rope_scaling"])


@pytest.mark.parametrize("name", CONFIGS)
def test_rope_tables_match_transformers(name):
    config = {**BASE, **CONFIGS[name]}
    rotary = Qwen3RotaryEmbedding(Qwen3Config(**config))
    positions = torch.arange(POSITIONS)[None]
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), positions)
    our_cos, our_sin = ours(config)
    # both take fp32 angles; we evaluate cos/sin in float64, transformers in fp32
    torch.testing.assert_close(our_cos.float(), cos[0], rtol=0, atol=2e-6)
    torch.testing.assert_close(our_sin.float(), sin[0], rtol=0, atol=2e-6)


def test_a_scaled_rope_differs_from_the_plain_one():
    """So the test above can fail: each type moves the tables away from plain RoPE."""
    plain = ours({**BASE, "rope_theta": 1e6})[0]
    for name in ("linear", "llama3", "yarn"):
        assert not torch.allclose(ours({**BASE, **CONFIGS[name]})[0], plain, atol=1e-3), name


def test_speculators_takes_the_sliding_entry_of_a_nested_rope():
    """speculators' own flattening of per-layer-type RoPE, then transformers' embedding."""
    pytest.importorskip("speculators", reason="pip install --no-deps speculators==0.9.0")
    from speculators.models.utils import flatten_rope_parameters

    nested = {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
              "sliding_attention": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}
    config = {**BASE, "rope_parameters": nested}
    rotary = Qwen3RotaryEmbedding(flatten_rope_parameters(Qwen3Config(**config)))
    cos, _ = rotary(torch.zeros(1, dtype=torch.float32), torch.arange(POSITIONS)[None])
    r = Reading(config, "speculators")
    read_rope(r)
    ours_cos, _ = rope_tables(POSITIONS, HEAD_DIM, r.fields["rope_theta"], r.fields["rope_scaling"])
    torch.testing.assert_close(ours_cos.float(), cos[0], rtol=0, atol=2e-6)
    assert "sliding_attention entry" in r.sources["rope_scaling"]


def test_what_is_ignored_is_named_in_the_source():
    r = Reading({**BASE, **CONFIGS["linear, an unused key"]}, "test")
    read_rope(r)
    assert "low_freq_factor ignored" in r.sources["rope_scaling"]
    r = Reading({**BASE, **CONFIGS["default, partial rotary"]}, "test")
    read_rope(r)
    assert "partial_rotary_factor=0.25 ignored" in r.sources["rope_scaling"]


def test_a_dynamic_rope_is_refused_past_its_plain_frequencies():
    from dspark_compile.config import lane_config
    from dspark_compile.errors import ConfigError

    dynamic = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 64}
    assert lane_config("tiny", rope_scaling=dynamic, max_context=64 - 5).max_context == 59
    with pytest.raises(ConfigError, match="max_context <= 59"):
        lane_config("tiny", rope_scaling=dynamic, max_context=60)


@pytest.mark.parametrize("params,match", [
    ({"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}, "longrope"),
    ({"rope_type": "linear"}, r"missing \['factor'\]"),
    # transformers' Qwen3 forward fails on the shapes (frequencies for a quarter of head_dim)
    ({"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.25},
     "partial_rotary_factor"),
    # transformers' Qwen3RotaryEmbedding reads no nesting (a KeyError in DeepSpec's model)
    ({"full_attention": {"rope_type": "default"}}, "one RoPE"),
])
def test_unsupported_rope_is_refused_by_name(params, match):
    with pytest.raises(CheckpointError, match=match):
        ours({**BASE, "rope_parameters": params})


def test_what_we_refuse_transformers_cannot_run():
    """The refusals above fail in transformers' own Qwen3 rotary embedding too."""
    for params in ({"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0,
                    "partial_rotary_factor": 0.25},
                   {"full_attention": {"rope_type": "default", "rope_theta": 1e4}}):
        with pytest.raises((KeyError, AttributeError, RuntimeError)):  # by version
            rotary = Qwen3RotaryEmbedding(Qwen3Config(**BASE, rope_parameters=params))
            cos, sin = rotary(torch.zeros(1), torch.arange(8)[None])
            q = torch.zeros(1, 4, 8, HEAD_DIM)
            q * cos[:, None]
