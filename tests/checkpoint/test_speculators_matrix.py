"""Every Markov head (and none) in both block layouts against every RoPE type, with the
activations and layer types rotated through them, each checkpoint made by speculators'
own classes: our eager draft step drafts the ids speculators' own heads draft, over rounds
that append the context."""

import pytest
from speculators_reference import load_reference, write_checkpoint, write_verifier
from test_speculators import assert_drafts_like_reference, load

pytest.importorskip("speculators", reason="the speculators package is the format's reference "
                    "(pip install --no-deps speculators==0.9.0)")

HEADS = {"vanilla": dict(markov_head_type="vanilla"), "gated": dict(markov_head_type="gated"),
         "rnn": dict(markov_head_type="rnn"),
         "none": dict(markov_rank=0, confidence_head_with_markov=False)}
LAYOUTS = {"anchor": dict(sample_from_anchor=True), "1+k": dict(sample_from_anchor=False)}
ROPES = {
    "default": {"rope_type": "default", "rope_theta": 2e4},
    "linear": {"rope_type": "linear", "rope_theta": 1e5, "factor": 2.0},
    "yarn": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
             "original_max_position_embeddings": 16},
    "llama3": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0},
}
ACTIVATIONS = ("silu", "swish", "gelu", "gelu_new", "gelu_pytorch_tanh")
LAYER_TYPES = {
    "full": ({}, {}),
    "sliding causal": (dict(layer_types=["sliding_attention", "full_attention"],
                            sliding_window=8, use_sliding_window=True), {}),
    "sliding non-causal": (dict(layer_types=["full_attention", "sliding_attention"],
                                sliding_window=6, use_sliding_window=True),
                           dict(sliding_window_non_causal=True)),
}


def cases():
    for p, (head, layout) in enumerate((h, l) for h in HEADS for l in LAYOUTS):
        for r, rope in enumerate(ROPES):
            act = ACTIVATIONS[(r + p) % len(ACTIVATIONS)]
            types = list(LAYER_TYPES)[(r + p) % len(LAYER_TYPES)]
            yield pytest.param(head, layout, rope, act, types, id=f"{head}-{layout}-{rope}-"
                               f"{act}-{types.replace(' ', '_')}")


@pytest.fixture(scope="module")
def verifier(tmp_path_factory):
    return write_verifier(tmp_path_factory.mktemp("verifier"))


@pytest.mark.parametrize("head,layout,rope,act,types", list(cases()))
def test_speculators_heads_layouts_ropes(tmp_path, verifier, head, layout, rope, act, types):
    layers, fields = LAYER_TYPES[types]
    path = write_checkpoint(tmp_path, verifier, seed=len(head) + len(rope), draft_vocab=128,
                            layers=dict(layers, hidden_act=act, max_position_embeddings=4096,
                                        rope_parameters=ROPES[rope]),
                            **HEADS[head], **LAYOUTS[layout], **fields)
    assert_drafts_like_reference(load(path, verifier), load_reference(path))
