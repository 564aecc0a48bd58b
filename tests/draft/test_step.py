import pytest
import torch

from dspark_compile.checkpoint import random_drafter
from dspark_compile.config import lane_config
from dspark_compile.draft import DraftStep, KVCache, RoundInputs, draft
from dspark_compile.draft.sampling import first_argmax, rounded
from dspark_compile.errors import InputError
from dspark_compile.tools.rounds import synthetic_rounds

ROUNDS = 4


def assert_identical(rounds) -> int:
    compared = 0
    for index, ((ids, confidences), ref) in enumerate(rounds):
        assert torch.equal(ids.cpu(), ref.ids), f"round {index}: ids differ"
        assert torch.equal(confidences.cpu(), ref.confidences), f"round {index}: confidences"
        compared += ids.numel()
    return compared


@pytest.mark.parametrize("lane_name", ["tiny", "tiny_d2t"])
@pytest.mark.parametrize("head", ["vanilla", "gated", "rnn"])
@pytest.mark.parametrize("layout", ["anchor_first", "one_plus_k"])
@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("context", [6, 300])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_device_path_matches_host_path(both_paths, device, lane_name, head, layout, batch,
                                       context, temperature):
    """temperature 1.0: odd rows sample (Gumbel-max), even rows stay greedy."""
    lane = lane_config(lane_name, markov_head=head, layout=layout)
    drafter = random_drafter(lane, device, seed=batch + context)
    compared = assert_identical(both_paths(drafter, batch, context, ROUNDS, seed=7,
                                           temperature=temperature))
    assert compared == ROUNDS * batch * lane.k


def test_greedy_rows_of_a_mixed_batch_stay_greedy_and_hot_rows_sample(device):
    lane = lane_config("tiny_d2t")
    drafter = random_drafter(lane, device, seed=2)
    caches = [KVCache.allocate(lane, 4, device, 128) for _ in range(3)]
    changed = 0
    for greedy, mixed, reseeded in zip(*(synthetic_rounds(lane, 4, 20, 4, 1, device, t)
                                         for t in (0.0, 1.5, 1.5))):
        reseeded = RoundInputs(*reseeded.tensors()[:5], reseeded.seed + 1)
        outs = [draft(drafter, cache, inputs)
                for cache, inputs in zip(caches, (greedy, mixed, reseeded))]
        assert torch.equal(outs[1].ids[0::2], outs[0].ids[0::2])  # T = 0 rows: greedy
        assert torch.equal(outs[2].ids[0::2], outs[0].ids[0::2])
        changed += int((outs[1].ids[1::2] != outs[2].ids[1::2]).sum())
    assert changed > 0  # hot rows depend on the seed


@pytest.mark.parametrize("lane_name", ["tiny", "tiny_d2t"])
@pytest.mark.parametrize("types,causal", [(["sliding_attention", "full_attention"], True),
                                          (["sliding_attention"] * 2, False),
                                          (["full_attention", "sliding_attention"], True)])
def test_masked_attention_variants_match_host_path(both_paths, device, lane_name, types,
                                                   causal):
    lane = lane_config(lane_name, layer_types=types, sliding_window=24, sliding_causal=causal)
    drafter = random_drafter(lane, device, seed=3)
    assert_identical(both_paths(drafter, 3, 60, ROUNDS, seed=5))


@pytest.mark.parametrize("lane_name", ["tiny", "tiny_d2t"])
def test_draft_step_compiles_without_graph_breaks(both_paths, device, lane_name):
    drafter = random_drafter(lane_config(lane_name), device, seed=1)
    torch._dynamo.reset()
    # fullgraph=True raises on any graph break; aot_eager traces through AOTAutograd
    # (functionalisation of the cache writes included) without Inductor's code generation
    step = torch.compile(DraftStep(drafter), fullgraph=True, dynamic=False, backend="aot_eager")
    assert_identical(both_paths(drafter, 3, 20, 3, seed=2, step=step, temperature=1.0))


def test_probs_on_request_are_the_draft_distribution_in_the_target_vocabulary(device):
    lane = lane_config("tiny_d2t")
    drafter = random_drafter(lane, device, seed=4)
    cache = KVCache.allocate(lane, 2, device, 64)
    inputs = next(synthetic_rounds(lane, 2, 16, 1, 0, device))
    temperature = torch.tensor([0.0, 0.7], device=device)
    out = draft(drafter, cache, RoundInputs(*inputs.tensors()[:4], temperature), with_probs=True)
    q = out.probs
    assert q.shape == (2, lane.k, lane.target_vocab_size) and q.dtype == torch.float32
    torch.testing.assert_close(q.sum(-1), torch.ones(2, lane.k, device=device))
    covered = torch.arange(lane.draft_vocab_size, device=device) + drafter.d2t
    outside = torch.ones(lane.target_vocab_size, dtype=torch.bool, device=device)
    outside[covered] = False
    assert float(q[..., outside].abs().max()) == 0.0  # mass only on the draft vocabulary
    assert torch.equal(q[0].argmax(-1), out.ids[0])  # greedy row: one-hot on its token
    assert float(q[0].max(-1).values.min()) == 1.0
    assert float(q[1].max(-1).values.max()) < 1.0  # sampled row: a spread distribution


class TestBadInputs:
    lane = lane_config("tiny")

    def setup_method(self):
        self.drafter = random_drafter(self.lane, "cpu", seed=0)
        self.cache = KVCache.allocate(self.lane, 2, "cpu", 64)
        self.inputs = next(synthetic_rounds(self.lane, 2, 16, 1, 0, "cpu"))

    def call(self, **changes):
        fields = dict(zip(["features", "num_new", "anchor", "anchor_pos"],
                          self.inputs.tensors()))
        fields.update(changes)
        draft(self.drafter, self.cache, RoundInputs(**fields))

    @pytest.mark.parametrize("field,value,message", [
        ("anchor", torch.tensor([0, 512]), "anchor: values in [0, 512]"),
        ("anchor", torch.tensor([-1, 3]), "[0, 512)"),
        ("num_new", torch.tensor([17, 1]), "[0, 16] (rows of features)"),
        ("anchor_pos", torch.tensor([3, 20]), "anchor_pos >= num_new"),
        ("anchor_pos", torch.tensor([65, 65]), "<= 64"),
        ("temperature", torch.tensor([0.5, float("nan")]), "1 negative, NaN or infinite"),
        ("temperature", torch.tensor([-0.5, float("inf")]), "2 negative, NaN or infinite"),
        ("seed", torch.tensor([0, (1 << 63) - 1]), "values in [0, 9223372036854775807]"),
        ("anchor", torch.tensor([1, 2], dtype=torch.int32), "dtype torch.int64"),
        ("anchor", torch.tensor([1, 2, 3]), "shape (2,)"),
        ("features", torch.zeros(2, 16, 192), "dtype torch.bfloat16"),
        ("features", torch.zeros(2, 16, 100, dtype=torch.bfloat16), "shape (2, 16, 192)"),
        ("features", torch.zeros(16, 192, dtype=torch.bfloat16), "[R, N, feature_size]"),
    ])
    def test_bad_round_inputs_raise_input_error(self, field, value, message):
        with pytest.raises(InputError, match=f"^{field}") as info:
            self.call(**{field: value})
        assert message in str(info.value)
        assert info.value.field == field

    @pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
    def test_a_valid_feature_row_holding_nan_or_inf_is_refused(self, value):
        features = self.inputs.features.clone()
        features[1, int(self.inputs.num_new[1]) - 1, 5] = value
        with pytest.raises(InputError, match="^features: NaN or Inf"):
            self.call(features=features)

    def test_feature_rows_of_the_largest_finite_values_are_taken(self):
        """Finite is each value, not the row's sum: bf16's largest values overflow any sum."""
        big = torch.finfo(torch.bfloat16).max
        features = torch.full_like(self.inputs.features, big)
        features[0, :, ::2] = -big
        assert torch.isfinite(features).all()
        self.call(features=features)

    def test_an_anchor_pos_that_wraps_below_num_new_is_refused(self):
        """-2^63 - 1 wraps to 2^63 - 1 in int64: the difference alone would pass."""
        with pytest.raises(InputError, match="^anchor_pos"):
            self.call(anchor_pos=torch.tensor([20, -(1 << 63)]), num_new=torch.tensor([1, 1]))

    def test_a_cache_larger_than_the_lane_does_not_raise_the_position_limit(self):
        """Positions index the lane's RoPE tables, sized by the lane's max_context."""
        self.cache = KVCache.allocate(self.lane, 2, "cpu", self.lane.max_context + 100)
        past = torch.full((2,), self.lane.max_context + 1)
        with pytest.raises(InputError, match=f"<= {self.lane.max_context} "):
            self.call(anchor_pos=past)

    def test_bad_cache_raises_input_error(self):
        self.cache = KVCache(self.cache.k[:, :1], self.cache.v[:, :1])
        with pytest.raises(InputError, match="cache.k: shape"):
            self.call()

    def test_wrong_device_raises_input_error(self):
        features = self.inputs.features.to("meta")
        with pytest.raises(InputError, match="features: device meta"):
            self.call(features=features)

    def test_nothing_is_written_before_a_bad_input_is_refused(self):
        before = self.cache.k.clone()
        with pytest.raises(InputError):
            self.call(anchor=torch.tensor([0, 10**6]))
        assert torch.equal(self.cache.k, before)


@pytest.mark.parametrize("size", [248320, 32000, 3072, 1000, 512, 128, 64, 30])
def test_first_argmax_equals_argmax_with_ties_eager_and_compiled(size):
    """The two-stage argmax keeps argmax's result, the lowest index winning ties."""
    gen = torch.Generator().manual_seed(size)
    compiled = torch.compile(first_argmax, fullgraph=True, dynamic=False)
    for _ in range(10):
        x = torch.randint(-2, 3, (4, size), generator=gen).double()  # ties everywhere
        x[1] = 7.0  # a whole row tied
        assert torch.equal(first_argmax(x), x.argmax(-1))
        assert torch.equal(compiled(x), x.argmax(-1))


def test_rounded_is_the_bf16_cast_bit_for_bit_eager_and_compiled():
    """Integer rounding of fp32 to bf16 precision == ``x.to(bf16).float()`` for every finite
    value: ties to even, negative values, subnormals, zeros, overflow to infinity."""
    gen = torch.Generator().manual_seed(0)
    bits = torch.randint(-2**31, 2**31 - 1, (200_000,), generator=gen, dtype=torch.int64)
    bits[:1000] = (bits[:1000] & ~0xFFFF) | 0x8000  # exact halfway: ties to even
    bits[1000:1002] = torch.tensor([0x7F7FFFFF, 0xFF7FFFFF - 2**32])  # max finite: to +-inf
    x = bits.to(torch.int32).view(torch.float32)
    x = torch.cat([x[torch.isfinite(x)], torch.tensor([0.0, -0.0, 1e-40, -1e-40])])
    want = x.to(torch.bfloat16).float().view(torch.int32)
    compiled = torch.compile(rounded, fullgraph=True, dynamic=False)
    for got in (rounded(x, torch.bfloat16), compiled(x, torch.bfloat16)):
        assert torch.equal(got.view(torch.int32), want)
