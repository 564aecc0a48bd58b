"""Side-by-side timings of one draft round: the host path, the eager device path and each
backend through the runtime, beside the roofline floor, all measured in one run.

The floor is the larger of (bytes one round must move) / (copy bandwidth measured now) and
(FLOPs one round must do) / (matmul rate measured now), at the lane's shapes.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, TypeVar

import torch
from tqdm import tqdm

from dspark_compile.artifacts import build_artifact, environment
from dspark_compile.config import LaneConfig
from dspark_compile.draft import KVCache, RoundInputs, draft
from dspark_compile.model import Drafter
from dspark_compile.reference import HostPath
from dspark_compile.runtime import load_runner


@dataclass
class Ceilings:
    bandwidth: float  # bytes/s, read + write of a large device copy
    matmul: float     # FLOP/s of a large square matmul in the lane's dtype


@dataclass
class Floor:
    bytes: int
    flops: int
    ms: float
    # writing the base logits [R, k, V] and reading them back, at the measured bandwidth:
    # traffic the floor leaves out, which only fusing the lm_head into the loop would save
    logits_ms: float

T = TypeVar("T")


def significant(x: float) -> float:
    """Four significant digits: a tiny lane's floor on a GPU is a few microseconds."""
    return float(f"{x:.4g}")


def timed(fn: Callable[[], T], device: torch.device) -> tuple[T, float]:
    """``fn()`` and its wall time in ms, the device synchronised before and after."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, (time.perf_counter() - start) * 1e3


def time_ms(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int) -> float:
    """Median wall time of ``fn`` in ms over ``repeats`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    return statistics.median(timed(fn, device)[1] for _ in range(repeats))


KERNEL_LAUNCHES = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel",
                   "cuLaunchKernelEx"}


def launches(fn: Callable[[], object], device: torch.device) -> tuple[int, int]:
    """(CUDA graph launches, single kernel launches) of one call of ``fn``, as the profiler
    records the CUDA runtime calls; (0, 0) off the GPU."""
    if device.type != "cuda":
        return 0, 0
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize(device)
    names = [event.name for event in prof.events()]
    return names.count("cudaGraphLaunch"), sum(name in KERNEL_LAUNCHES for name in names)


def measure_ceilings(device: torch.device, dtype: torch.dtype) -> Ceilings:
    big = (1 << 28) if device.type == "cuda" else (1 << 24)  # elements of a copy
    src = torch.ones(big, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    copy_ms = time_ms(lambda: dst.copy_(src), device, repeats=10, warmup=2)
    n = 8192 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    mm_ms = time_ms(lambda: a @ b, device, repeats=10, warmup=2)
    return Ceilings(bandwidth=2 * src.numel() * 4 / (copy_ms / 1e3),
                    matmul=2 * n ** 3 / (mm_ms / 1e3))


def round_floor(drafter: Drafter, batch: int, context: int, ceilings: Ceilings) -> Floor:
    """Bytes and FLOPs one decode round must move and do at these shapes."""
    lane: LaneConfig = drafter.lane
    size = torch.finfo(lane.torch_dtype).bits // 8
    w2 = drafter.markov_head.markov_w2.weight.numel()
    # every weight once, W2 once per step; embeddings and W1 only as rows (negligible)
    params = sum(p.numel() for name, p in drafter.named_parameters()
                 if name not in ("embed_tokens.weight", "markov_head.markov_w1.weight"))
    weight_bytes = (params + (lane.k - 1) * w2) * size
    kv_bytes = (2 * batch * lane.num_layers * lane.num_kv_heads * (context + lane.block_rows)
                * lane.head_dim * size)
    new_rows, rows = lane.k + 1, lane.block_rows
    H, q, kv = lane.hidden_size, lane.num_heads * lane.head_dim, lane.num_kv_heads * lane.head_dim
    append = new_rows * (lane.feature_size * H + lane.num_layers * 2 * H * kv)
    layer = H * q + 2 * H * kv + q * H + 3 * H * lane.intermediate_size
    attention = 2 * lane.num_heads * rows * (context + rows) * lane.head_dim
    heads = lane.k * H * lane.draft_vocab_size + lane.k * lane.markov_rank * lane.draft_vocab_size
    flops = 2 * batch * (append + lane.num_layers * (rows * layer + attention) + heads)
    total_bytes = weight_bytes + kv_bytes + batch * new_rows * lane.feature_size * size
    ms = max(total_bytes / ceilings.bandwidth, flops / ceilings.matmul) * 1e3
    logits_bytes = 2 * batch * lane.k * lane.draft_vocab_size * size
    return Floor(bytes=int(total_bytes), flops=int(flops), ms=ms,
                 logits_ms=logits_bytes / ceilings.bandwidth * 1e3)


def one_round(drafter: Drafter, batch: int, context: int, seed: int,
              device: torch.device) -> tuple[RoundInputs, RoundInputs]:
    """A prompt of ``context`` rows for every request, then one decode round after it."""
    lane = drafter.lane
    gen = torch.Generator(device=device).manual_seed(seed)

    def features(rows: int) -> torch.Tensor:
        return torch.randn(batch, rows, lane.feature_size, generator=gen, device=device,
                           dtype=lane.torch_dtype)

    def full(value: int) -> torch.Tensor:
        return torch.full((batch,), value, dtype=torch.long, device=device)

    anchors = torch.randint(0, lane.target_vocab_size, (2, batch), generator=gen, device=device)
    prompt = RoundInputs(features(context), full(context), anchors[0], full(context))
    decode = RoundInputs(features(lane.k + 1), full(lane.k + 1), anchors[1],
                         full(context + lane.k + 1))
    return prompt, decode


def run_bench(drafter: Drafter, backends: list[str], buckets: list[int], context: int,
              artifacts_dir: str, repeats: int, warmup: int, seed: int) -> dict:
    """Time every path at every bucket; rows carry ms, speed-up, ratio to floor, bytes."""
    lane, device = drafter.lane, drafter.fc.weight.device
    ceilings = measure_ceilings(device, lane.torch_dtype)
    runners = {}
    for backend in tqdm(backends, desc="artifacts", leave=False):
        path, _ = build_artifact(drafter, backend, buckets, artifacts_dir)
        runners[backend] = (path, load_runner(path, device))
    host = HostPath(drafter)
    rows = []
    steps = tqdm(total=len(buckets) * (2 + len(backends)), desc="timing", leave=False)
    for batch in buckets:
        floor = round_floor(drafter, batch, context, ceilings)
        prompt, decode = one_round(drafter, batch, context, seed, device)
        # decode rounds rewrite the same positions with the same rows: each repeat is the
        # same round, so repeats are comparable and every path ends in the same state
        host_cache, eager_cache = (KVCache.allocate(lane, batch, device,
                                                    context + lane.k + 1) for _ in "he")
        host.draft(host_cache, prompt)
        reference = host.draft(host_cache, decode)
        # greedy picks that a one-ulp change of a bf16 logit could flip: where a path that
        # sums in another order (the fused Markov step) could differ, if anywhere
        near_ties = int(reference.near_ties.sum())
        paths = {"host": lambda: host.draft(host_cache, decode)}
        draft(drafter, eager_cache, prompt)
        paths["device (eager)"] = lambda: draft(drafter, eager_cache, decode)
        expected = {}  # paths whose backend forces another dtype: their own host path
        for backend, (_, runner) in runners.items():
            own_prompt, own_decode = prompt, decode
            if runner.lane.dtype != lane.dtype:
                own_prompt, own_decode = (replace(r, features=r.features.to(
                    runner.lane.torch_dtype)) for r in (prompt, decode))
                own_cache = KVCache.allocate(runner.lane, batch, device, context + lane.k + 1)
                HostPath(runner.drafter).draft(own_cache, own_prompt)
                expected[f"runtime ({backend})"] = HostPath(runner.drafter).draft(
                    own_cache, own_decode).ids
            slots = [runner.admit() for _ in range(batch)]
            runner.draft(own_prompt, slots)
            paths[f"runtime ({backend})"] = (
                lambda runner=runner, slots=slots, d=own_decode: runner.draft(d, slots))
        for name, fn in paths.items():
            ms = time_ms(fn, device, repeats, warmup)
            out = fn()
            identical = torch.equal(out.ids.cpu(), expected.get(name, reference.ids))
            d2h = reference.transfers.d2h_bytes if name == "host" else batch * lane.k * 12
            graphs, kernels = launches(fn, device)  # after timing: the profiler costs time
            rows.append(dict(lane=lane.name, batch=batch, path=name, ms=significant(ms),
                             vs_host=None, vs_floor=significant(ms / floor.ms),
                             identical=identical, near_ties=near_ties, d2h_bytes=d2h,
                             graphs=graphs, kernels=kernels, floor_ms=significant(floor.ms),
                             floor_bytes=floor.bytes, floor_flops=floor.flops,
                             logits_ms=significant(floor.logits_ms)))
            steps.update()
        host_ms = next(r["ms"] for r in rows if r["batch"] == batch and r["path"] == "host")
        for r in rows:
            if r["batch"] == batch:
                r["vs_host"] = significant(host_ms / r["ms"])
        for _, runner in runners.values():
            for slot in runner.slots:
                runner.release(slot)
    steps.close()
    return dict(lane=lane.to_dict(), context=context, repeats=repeats, warmup=warmup,
                env=environment(device), ceilings=asdict(ceilings),
                artifacts={b: str(p) for b, (p, _) in runners.items()}, rows=rows)


def plot(result: dict, path: Path) -> None:
    import matplotlib
    import matplotlib.ticker
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in dict.fromkeys(r["path"] for r in rows):
        mine = [r for r in rows if r["path"] == name]
        ax.plot([r["batch"] for r in mine], [r["ms"] for r in mine], marker="o", label=name)
    floor = [r for r in rows if r["path"] == "host"]
    ax.plot([r["batch"] for r in floor], [r["floor_ms"] for r in floor], "k--",
            label="roofline floor")
    batches = sorted({r["batch"] for r in rows})
    ax.set_xscale("log")
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set(yscale="log", xlabel="batch (requests)", ylabel="ms per draft round",
           title=f"{result['lane']['name']}: one draft round, context {result['context']} "
                 f"({result['env'].get('gpu', result['env']['device_type'])})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(result: dict, out_dir: str | Path, stem: str) -> tuple[Path, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out_dir / f"{stem}.json", out_dir / f"{stem}.png"
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, png_path)
    return json_path, png_path


if __name__ == "__main__":
    from dspark_compile.cli import bench_main

    bench_main()
