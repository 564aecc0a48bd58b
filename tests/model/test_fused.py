"""A fused projection reads and writes state dicts as its parts, and computes what the
separate Linears of transformers' Qwen3 layer compute."""

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from dspark_compile.config import lane_config
from dspark_compile.model.backbone import MLP, Attention
from dspark_compile.model.fused import FusedLinear, keep_part_names

transformers = pytest.importorskip("transformers")
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP  # noqa: E402


class Owner(nn.Module):
    def __init__(self):
        super().__init__()
        self.ab = FusedLinear(3, {"a": 2, "b": 4}, bias=True)
        keep_part_names(self)


def test_state_dicts_name_the_parts_and_load_them_in_row_order(tmp_path):
    owner = Owner()
    state = owner.state_dict()
    assert sorted(state) == ["a.bias", "a.weight", "b.bias", "b.weight"]
    assert torch.equal(state["a.weight"], owner.ab.weight[:2])
    assert torch.equal(state["b.bias"], owner.ab.bias[2:])
    save_file(state, tmp_path / "parts.safetensors")  # no two tensors share storage
    parts = {"a.weight": torch.randn(2, 3), "b.weight": torch.randn(4, 3),
             "a.bias": torch.randn(2), "b.bias": torch.randn(4)}
    save_file(parts, tmp_path / "other.safetensors")
    owner.load_state_dict(load_file(tmp_path / "other.safetensors"))
    assert torch.equal(owner.ab.weight, torch.cat([parts["a.weight"], parts["b.weight"]]))
    assert torch.equal(owner.ab.bias, torch.cat([parts["a.bias"], parts["b.bias"]]))
    assert torch.equal(owner.ab.rows("b")[0], parts["b.weight"])


def test_the_fused_mlp_computes_transformers_qwen3_mlp():
    lane = lane_config("tiny")
    ours = MLP(lane).double()
    config = transformers.Qwen3Config(hidden_size=lane.hidden_size,
                                      intermediate_size=lane.intermediate_size,
                                      hidden_act=lane.hidden_act)
    theirs = Qwen3MLP(config).double()
    theirs.load_state_dict(ours.state_dict())  # gate_proj, up_proj, down_proj by name
    x = torch.randn(2, 5, lane.hidden_size, dtype=torch.float64)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-12, atol=1e-12)


def test_the_context_keys_and_values_are_the_k_and_v_rows_of_the_fused_projection():
    lane = lane_config("tiny")
    attention = Attention(lane).double()
    gen = torch.Generator().manual_seed(0)
    for parameter in attention.parameters():  # the norms' weights start uninitialised
        parameter.data.normal_(generator=gen)
    state = attention.state_dict()
    x = torch.randn(2, 3, lane.hidden_size, dtype=torch.float64)
    positions = torch.zeros(2, 3, lane.head_dim, dtype=torch.float64)
    k, v = attention.keys_values(x, positions + 1, positions)  # cos 1, sin 0: no rotation
    shape = (2, 3, lane.num_kv_heads, lane.head_dim)
    torch.testing.assert_close(v, (x @ state["v_proj.weight"].T).view(shape))
    torch.testing.assert_close(k, attention.k_norm((x @ state["k_proj.weight"].T).view(shape)))


def test_state_sources_rebuild_every_parameter_from_the_state_dict():
    """What the C++ runtime does with a weights file: every parameter and persistent buffer
    is its state-dict entries concatenated, and each entry is used once."""
    from dspark_compile.checkpoint import random_drafter
    from dspark_compile.model.fused import state_sources

    drafter = random_drafter(lane_config("tiny_d2t"), "cpu", seed=0)
    state, sources = drafter.state_dict(), state_sources(drafter)
    used = [name for parts in sources.values() for name in parts]
    assert sorted(used) == sorted(state)
    tensors = {**dict(drafter.named_parameters()), **dict(drafter.named_buffers())}
    for name, parts in sources.items():
        assert torch.equal(tensors[name], torch.cat([state[part] for part in parts])), name
