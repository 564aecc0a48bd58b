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


@pytest.mark.parametrize("params,match", [
    ({"rope_type": "dynamic", "factor": 2.0}, "dynamic and longrope change"),
    ({"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}, "longrope"),
    ({"rope_type": "linear"}, r"missing \['factor'\]"),
    ({"rope_type": "linear", "factor": 2.0, "low_freq_factor": 1.0}, "unknown"),
    ({"rope_type": "default", "partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({"full_attention": {"rope_type": "default"}}, "one RoPE for every layer"),
])
def test_unsupported_rope_is_refused_by_name(params, match):
    with pytest.raises(CheckpointError, match=match):
        ours({**BASE, "rope_parameters": params})
