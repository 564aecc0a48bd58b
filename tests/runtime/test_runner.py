import os
import random
import subprocess
import sys
import threading
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dspark_compile import kernels
from dspark_compile.draft import KVCache, RoundInputs
from dspark_compile.errors import ArtifactError, ConfigError, InputError, RunnerBusyError
from dspark_compile.draft import HostPath
from dspark_compile.tools.rounds import synthetic_rounds
from dspark_compile.runtime import Runner, load_runner
from dspark_compile.runtime.capture import copy_into

FRESH = """
import sys
from dspark_compile import load_runner
runner = load_runner(sys.argv[1], sys.argv[2])
print(runner.buckets, *(name in sys.modules for name in ("hydra", "onnxruntime", "torch._dynamo")))
"""


@pytest.fixture
def runner(built_artifact, device):
    return load_runner(built_artifact("eager", "tiny"), device)


def test_load_runner_in_a_fresh_process_imports_no_hydra_and_no_compiler(built_artifact, device):
    """Dynamo only where the step runs kernels of our own (on a GPU): they register as
    ``triton_op``s, which import it, at the warm-up's first call."""
    artifact = built_artifact("eager", "tiny")
    result = subprocess.run([sys.executable, "-c", FRESH, str(artifact), device.type],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[3]", "False", "False", str(kernels.runs_on(device))]


def test_admitting_past_the_largest_bucket_is_an_error(runner):
    for _ in range(3):
        runner.admit()
    with pytest.raises(InputError, match=r"slots: all 3 rows in use"):
        runner.admit()


def test_unknown_or_repeated_slots_are_errors(runner, device):
    a, b = runner.admit(), runner.admit()
    inputs = next(synthetic_rounds(runner.lane, 2, 16, 1, 0, device))
    with pytest.raises(InputError, match="slot: 7 is not admitted"):
        runner.draft(inputs, [a, 7])
    with pytest.raises(InputError, match="repeats a slot"):
        runner.draft(inputs, [a, a])
    with pytest.raises(InputError, match="2 rows for 1 slots"):
        runner.draft(inputs, [b])
    runner.release(b)
    with pytest.raises(InputError, match=f"slot: {b} is not admitted"):
        runner.release(b)


def test_inert_rows_do_not_change_the_real_rows(built_artifact, device):
    """A request drafted alone (two inert rows in bucket 3) equals the same request drafted
    beside two others, whatever those hold."""
    alone = load_runner(built_artifact("eager", "tiny"), device)
    crowded = load_runner(built_artifact("eager", "tiny"), device)
    solo = [alone.admit()]
    trio = [crowded.admit() for _ in range(3)]
    for inputs in synthetic_rounds(alone.lane, 3, 20, 3, 1, device):
        first = RoundInputs(*(t[:1] for t in inputs.tensors()))
        a, b = alone.draft(first, solo), crowded.draft(inputs, trio)
        assert torch.equal(a.ids, b.ids[:1])
        assert torch.equal(a.confidences, b.confidences[:1])


def test_release_moves_the_last_row_into_the_hole_and_keeps_its_state(runner, device):
    slots = [runner.admit() for _ in range(3)]
    rounds = list(synthetic_rounds(runner.lane, 3, 20, 3, 2, device))
    for inputs in rounds[:2]:
        runner.draft(inputs, slots)
    kept = runner.cache.k[runner.row_of(slots[2])].clone()
    runner.release(slots[0])
    assert runner.row_of(slots[2]) == 0 and runner.row_of(slots[1]) == 1
    assert torch.equal(runner.cache.k[0], kept)


def test_concurrent_calls_from_two_threads_are_refused(runner, device, monkeypatch):
    """The threading contract: a second thread gets RunnerBusyError, never a mixed state."""
    slot = runner.admit()
    inputs = next(synthetic_rounds(runner.lane, 1, 16, 1, 0, device))
    inside, release = threading.Event(), threading.Event()
    run = Runner._run

    def slow_run(self, *args):
        inside.set()
        release.wait(10)
        return run(self, *args)
    monkeypatch.setattr(Runner, "_run", slow_run)
    first = threading.Thread(target=runner.draft, args=(inputs, [slot]))
    first.start()
    assert inside.wait(10)
    with pytest.raises(RunnerBusyError, match="not thread-safe"):
        runner.draft(inputs, [slot])
    with pytest.raises(RunnerBusyError):
        runner.admit()
    release.set()
    first.join()
    runner.draft(inputs, [slot])  # free again once the first call is done


def test_nan_in_valid_feature_rows_is_refused_and_padding_may_hold_anything(runner, device):
    slot = runner.admit()
    inputs = next(synthetic_rounds(runner.lane, 1, 16, 1, 0, device))
    n = int(inputs.num_new[0])
    poisoned = inputs.features.clone()
    poisoned[0, n - 1, 3] = float("nan")
    with pytest.raises(InputError, match="features: NaN or Inf"):
        runner.draft(RoundInputs(poisoned, *inputs.tensors()[1:]), [slot])
    padded = torch.cat([inputs.features, torch.full_like(inputs.features[:, :2], float("inf"))], 1)
    runner.draft(RoundInputs(padded, *inputs.tensors()[1:]), [slot])


RUNNERS = {}


def shared_runner(artifact, device):
    """One runner for every hypothesis example (building one per example is slow)."""
    key = (str(artifact), device.type)
    if key not in RUNNERS:
        RUNNERS[key] = load_runner(artifact, device)
    return RUNNERS[key]


DTYPES = [torch.bfloat16, torch.float32, torch.int64]


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_round_inputs_draft_exactly_when_they_keep_the_rules(built_artifact, device, data):
    runner = shared_runner(built_artifact("eager", "tiny"), device)
    lane = runner.lane
    while len(runner.slots) < 2:
        runner.admit()
    admitted = runner.slots
    R = data.draw(st.integers(0, 3))
    N = data.draw(st.integers(0, 9))
    width = data.draw(st.sampled_from([lane.feature_size, lane.feature_size + 1]))
    dtype = data.draw(st.sampled_from(DTYPES))
    def ints(lo: int, hi: int) -> torch.Tensor:
        values = data.draw(st.lists(st.integers(lo, hi), min_size=R, max_size=R))
        return torch.tensor(values, dtype=torch.long)

    features = torch.randn(R, N, width).to(dtype)
    num_new = ints(-1, N + 1)
    anchor = ints(-2, lane.target_vocab_size + 1)
    anchor_pos = ints(-1, runner.max_context + 2)
    slots = data.draw(st.lists(st.sampled_from(admitted + [99]), min_size=R, max_size=R))
    inputs = RoundInputs(*(t.to(device) for t in (features, num_new, anchor, anchor_pos)))
    # the contract, recomputed from the draws: any broken rule is refused, all kept drafts
    valid = (R >= 1 and width == lane.feature_size and dtype == lane.torch_dtype
             and 99 not in slots and len(set(slots)) == R
             and all(0 <= n <= N for n in num_new.tolist())
             and all(0 <= a < lane.target_vocab_size for a in anchor.tolist())
             and all(n <= p <= runner.max_context
                     for n, p in zip(num_new.tolist(), anchor_pos.tolist())))
    if not valid:
        with pytest.raises(InputError):
            runner.draft(inputs, slots)
        return
    out = runner.draft(inputs, slots)
    assert out.ids.shape == (R, lane.k)
    assert int(out.ids.min()) >= 0 and int(out.ids.max()) < lane.target_vocab_size


def broken(inputs: RoundInputs, rule: int, capacity: int) -> tuple[RoundInputs, str]:
    """``inputs`` with one value rule of ``round_rules`` broken in one row, and the field
    whose error that gives."""
    features, num_new, anchor, anchor_pos, temperature, seed = (
        t.clone() for t in inputs.tensors())
    if rule == 0:
        anchor[1] += 10**6
    elif rule == 1:
        num_new[1] = features.shape[1] + 1
    elif rule == 2:
        anchor_pos[1] = num_new[1] - 1
    elif rule == 3:
        anchor_pos[1] = capacity + 1
    elif rule == 4:
        features[1, num_new[1] - 1, 0] = float("nan")
    elif rule == 5:
        temperature[1] = float("nan")
    else:
        seed[1] = 1 << 32
    field = ["anchor", "num_new", "anchor_pos", "anchor_pos", "features", "temperature",
             "seed"][rule]
    return RoundInputs(features, num_new, anchor, anchor_pos, temperature, seed), field


def test_a_valid_call_after_invalid_ones_matches_the_host_path(built_artifact, device):
    """Decode rounds check their values inside the step: a round that breaks a rule runs
    inert and raises after it, so the context is as if it never ran."""
    runner = load_runner(built_artifact("eager", "tiny"), device)
    slots = [runner.admit() for _ in range(2)]
    host, host_cache = HostPath(runner.drafter), KVCache.allocate(runner.lane, 3, device)
    for index, inputs in enumerate(synthetic_rounds(runner.lane, 2, 20, 8, 9, device)):
        if index:  # the first round is the prompt, appended before the step
            bad, field = broken(inputs, index - 1, runner.max_context)
            with pytest.raises(InputError, match=f"^{field}"):
                runner.draft(bad, slots)
        out = runner.draft(inputs, slots)
        full, rows = runner.layout(inputs, slots)
        ref = host.draft(host_cache, full)
        assert torch.equal(out.ids.cpu(), ref.ids[rows.cpu()])
        assert torch.equal(out.confidences.cpu(), ref.confidences[rows.cpu()])


def test_a_full_bucket_in_row_order_matches_the_host_path(built_artifact, device):
    """The whole bucket drafting in row order skips the layout; other orders take it."""
    runner = load_runner(built_artifact("eager", "tiny"), device)
    slots = [runner.admit() for _ in range(3)]
    host, host_cache = HostPath(runner.drafter), KVCache.allocate(runner.lane, 3, device)
    for index, inputs in enumerate(synthetic_rounds(runner.lane, 3, 20, 4, 9, device)):
        order = slots if index % 2 else slots[::-1]
        picked = torch.tensor([slots.index(s) for s in order], device=device)
        out = runner.draft(RoundInputs(*(t[picked] for t in inputs.tensors())), order)
        ref = host.draft(host_cache, inputs)
        assert torch.equal(out.ids.cpu(), ref.ids[picked.cpu()])
        assert torch.equal(out.confidences.cpu(), ref.confidences[picked.cpu()])


@pytest.mark.parametrize("contiguous", [True, False])
def test_copy_into_copies_each_tensor_of_its_own_dtype(device, contiguous):
    """Contiguous inputs are copied as bytes, others as they are; either way each buffer
    ends up equal to its tensor, and a buffer passed as its own tensor is left alone."""
    gen = torch.Generator().manual_seed(0)
    values = [torch.randn(3, 8, generator=gen).to(torch.bfloat16),
              torch.randint(-1 << 40, 1 << 40, (3, 2), generator=gen),
              torch.randn(3, 2, generator=gen)]
    values = [(v if contiguous else v[:, ::2]).to(device) for v in values]
    buffers = [torch.zeros(v.shape, dtype=v.dtype, device=device) for v in values]
    kept = torch.ones(5, device=device)
    copy_into([*buffers, kept], [*values, kept])
    assert all(b.dtype == v.dtype and torch.equal(b, v) for b, v in zip(buffers, values))
    assert torch.equal(kept, torch.ones(5, device=device))


def test_a_round_without_temperature_and_seed_drafts_greedily_after_a_sampled_one(
        built_artifact, device):
    """Left out, T and the seed are 0 in every round, whatever the round before held."""
    runner = load_runner(built_artifact("eager", "tiny"), device)
    slots = [runner.admit() for _ in range(3)]
    host, host_cache = HostPath(runner.drafter), KVCache.allocate(runner.lane, 3, device)
    for index, inputs in enumerate(synthetic_rounds(runner.lane, 3, 20, 5, 4, device, 1.0)):
        if index % 2 == 0:
            inputs = RoundInputs(*inputs.tensors()[:4])
        out = runner.draft(inputs, slots)
        ref = host.draft(host_cache, inputs)
        assert torch.equal(out.ids.cpu(), ref.ids.cpu())
        assert torch.equal(out.confidences.cpu(), ref.confidences.cpu())


def test_an_inductor_runner_reaches_each_bucket_by_its_shapes(built_artifact, device):
    """Each bucket is a saved function of its own, guarded on its inputs' shapes: after
    both are warm, rounds go to one, then the other, then back."""
    runner = load_runner(built_artifact("inductor", "tiny_d2t", buckets=(1, 3)), device)
    host = HostPath(runner.drafter)
    for phase, batch in enumerate([1, 3, 1]):
        slots = [runner.admit() for _ in range(batch)]
        assert runner.bucket(len(runner.slots)) == batch
        host_cache = KVCache.allocate(runner.lane, batch, device)
        for inputs in synthetic_rounds(runner.lane, batch, 20, 3, phase, device):
            out = runner.draft(inputs, slots)
            ref = host.draft(host_cache, inputs)
            assert torch.equal(out.ids.cpu(), ref.ids.cpu())
            assert torch.equal(out.confidences.cpu(), ref.confidences.cpu())
        for slot in slots:
            runner.release(slot)


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_soak_five_hundred_rounds_with_requests_coming_and_going(built_artifact, device):
    """Random admits and releases, random subsets drafting: token-identical to the host
    path on a shadow cache that mirrors every row move, and no growth in memory."""
    runner = load_runner(built_artifact("eager", "tiny"), device)
    lane, rng = runner.lane, random.Random(0)
    gen = torch.Generator(device=device).manual_seed(0)
    host = HostPath(runner.drafter)
    shadow = KVCache.allocate(lane, runner.buckets[-1], device)
    position: dict[int, int] = {}  # slot -> anchor position; absent until its prompt
    admitted: list[int] = []
    rounds, compared, baseline = 500, 0, None
    for index in range(rounds):
        if admitted and rng.random() < 0.08:
            gone = admitted.pop(rng.randrange(len(admitted)))
            before = {s: runner.row_of(s) for s in admitted}
            runner.release(gone)
            position.pop(gone, None)
            for slot, row in before.items():  # mirror the runner's row moves
                if runner.row_of(slot) != row:
                    shadow.k[runner.row_of(slot)] = shadow.k[row]
                    shadow.v[runner.row_of(slot)] = shadow.v[row]
        if len(admitted) < runner.buckets[-1] and (not admitted or rng.random() < 0.1):
            admitted.append(runner.admit())
        drafting = rng.sample(admitted, rng.randint(1, len(admitted)))
        if any(position.get(s, 0) > runner.max_context - lane.k - 1 for s in drafting):
            for slot in drafting:  # a request that reached the context limit starts over
                position.pop(slot, None)
        new = [rng.randint(4, 12) if s not in position else rng.randint(1, lane.k + 1)
               for s in drafting]
        width = lane.k + 1 if all(s in position for s in drafting) else max(new)
        for slot, n in zip(drafting, new):
            position[slot] = position.get(slot, 0) + n
        inputs = RoundInputs(
            torch.randn(len(drafting), width, lane.feature_size, generator=gen, device=device,
                        dtype=lane.torch_dtype),
            torch.tensor(new, device=device),
            torch.randint(0, lane.target_vocab_size, (len(drafting),), generator=gen,
                          device=device),
            torch.tensor([position[s] for s in drafting], device=device))
        out = runner.draft(inputs, drafting)
        full, rows = runner.layout(inputs, drafting)
        bucket = full.features.shape[0]
        ref = host.draft(KVCache(shadow.k[:bucket], shadow.v[:bucket]), full)
        rows = rows.cpu()
        assert torch.equal(out.ids.cpu(), ref.ids[rows]), f"round {index}"
        assert torch.equal(out.confidences.cpu(), ref.confidences[rows]), f"round {index}"
        compared += out.ids.numel()
        if index == 200:
            baseline = rss_mb()
    assert compared >= rounds * lane.k
    assert rss_mb() - baseline < 32, "memory grew over the soak"


def test_outputs_stay_valid_after_the_next_round(runner, device):
    """The runner reuses its output buffers; what draft() returned is the caller's."""
    slots = [runner.admit() for _ in range(2)]
    first, second = list(synthetic_rounds(runner.lane, 2, 16, 2, 3, device))
    out = runner.draft(first, slots)
    ids, confidences = out.ids.clone(), out.confidences.clone()
    later = runner.draft(second, slots)
    assert not torch.equal(later.ids, ids)  # the second round really differs
    assert torch.equal(out.ids, ids) and torch.equal(out.confidences, confidences)
    assert out.ids.device.type == "cpu"  # ids and confidences come back to the host


def test_a_decode_round_is_one_cuda_graph_replay(runner, device):
    from dspark_compile.tools.timing import launches

    if device.type != "cuda":
        pytest.skip("CUDA graphs need a CUDA device")
    slots = [runner.admit()]
    prompt, decode = list(synthetic_rounds(runner.lane, 1, 16, 2, 0, device))
    runner.draft(prompt, slots)
    graphs, _ = launches(lambda: runner.draft(decode, slots), device)
    assert graphs == 1


def test_a_decode_round_downloads_once(runner, device):
    """ids, confidences and the rules kept come back in one device-to-host copy."""
    from torch.profiler import ProfilerActivity, profile

    if device.type != "cuda":
        pytest.skip("downloads are device-to-host copies on a GPU only")
    slots = [runner.admit() for _ in range(2)]
    prompt, decode = list(synthetic_rounds(runner.lane, 2, 16, 2, 0, device))
    runner.draft(prompt, slots)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        runner.draft(decode, slots)
        torch.cuda.synchronize(device)
    copies = [e.name for e in prof.events() if "DtoH" in e.name]
    assert len(copies) == 1, copies


@pytest.fixture
def two_buckets(tmp_path):
    """An eager artifact with buckets 1 and 2, of its own (safe to damage)."""
    from dspark_compile.checkpoint import random_drafter
    from dspark_compile.compile import build_artifact
    from dspark_compile.config import lane_config

    drafter = random_drafter(lane_config("tiny"), "cpu", seed=0)
    return build_artifact(drafter, "eager", [1, 2], tmp_path / "root")[0]


def test_a_subset_of_buckets_drafts_as_the_whole_artifact_does(two_buckets):
    whole, one = load_runner(two_buckets, "cpu"), load_runner(two_buckets, "cpu", buckets=[1])
    assert (whole.buckets, one.buckets) == ([1, 2], [1])
    assert one.cache.k.shape[0] == 1  # the cache holds the rows of the buckets loaded
    outputs = []
    for runner in (whole, one):
        slot = runner.admit()
        outputs.append([runner.draft(inputs, [slot]) for inputs in
                        synthetic_rounds(runner.lane, 1, 24, 3, seed=5, device="cpu",
                                         temperature=1.0)])
    for a, b in zip(*outputs):
        assert torch.equal(a.ids, b.ids) and torch.equal(a.confidences, b.confidences)
    with pytest.raises(ConfigError, match=r"holds buckets \[1, 2\], asked for \[4\]"):
        load_runner(two_buckets, "cpu", buckets=[4])


def test_a_subset_load_still_checks_every_file(two_buckets):
    import json

    from dspark_compile.compile.key import file_sha256
    from dspark_compile.compile.store import MANIFEST

    # a payload of bucket 2 alone (as aoti's bucket2.pt2), then damaged
    payload = two_buckets / "bucket2.bin"
    payload.write_bytes(b"bucket 2")
    manifest = json.loads((two_buckets / MANIFEST).read_text())
    manifest["files"][payload.name] = file_sha256(payload)
    (two_buckets / MANIFEST).write_text(json.dumps(manifest))
    assert load_runner(two_buckets, "cpu", buckets=[1]).buckets == [1]
    payload.write_bytes(b"bucket 3")
    with pytest.raises(ArtifactError, match="bucket2.bin fails its sha256 check"):
        load_runner(two_buckets, "cpu", buckets=[1])


def test_the_runner_says_where_its_load_time_went(built_artifact, device):
    """The phases, one after the other, account for the load as a clock outside it saw it
    (less only the call's own entry and exit)."""
    start = time.perf_counter()
    runner = load_runner(built_artifact("eager", "tiny"), device)
    outside = time.perf_counter() - start
    phases = ["manifest and sha256", "weights and their sha256", "backend load",
              "warm-up and capture"]
    seconds = runner.load_seconds
    assert list(seconds) == phases + ["total", "backend beside the weights"]
    assert all(seconds[p] >= 0 for p in phases)
    assert 0.5 * outside <= sum(seconds[p] for p in phases) <= outside
    # the thread starts after the manifest's check and ends within the backend's load
    assert 0 <= seconds["backend beside the weights"] <= (
        seconds["weights and their sha256"] + seconds["backend load"] + 1e-3)


