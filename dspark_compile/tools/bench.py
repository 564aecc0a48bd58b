"""``dspark-bench``: one draft round timed on every path (the host path, the eager device
path, each backend through the runtime) at every batch bucket, beside the roofline floor,
all measured in one run; every path also checked against the host path."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from dspark_compile.compile import build_artifact
from dspark_compile.compile.key import environment
from dspark_compile.model import Drafter
from dspark_compile.runtime import load_runner
from dspark_compile.tools.commands import BenchConfig, make_drafter
from dspark_compile.tools.compare import HOST, Comparison, runtime_path
from dspark_compile.tools.report import print_table, write
from dspark_compile.tools.roofline import measure_ceilings, round_floor
from dspark_compile.tools.rounds import synthetic_rounds
from dspark_compile.tools.timing import launches, time_ms

COLUMNS = ("lane", "batch", "path", "ms", "replay_ms", "vs_host", "floor_ms", "vs_floor",
           "d2h_bytes", "graphs", "kernels", "identical", "near_ties")


def significant(x: float) -> float:
    """Four significant digits: a tiny lane's floor on a GPU is a few microseconds."""
    return float(f"{x:.4g}")


def run_bench(drafter: Drafter, backends: list[str], buckets: list[int], context: int,
              artifacts_dir: str, repeats: int, warmup: int, seed: int) -> dict:
    """Time every path at every bucket; rows carry ms, speed-up, ratio to floor, bytes."""
    lane, device = drafter.lane, drafter.fc.weight.device
    ceilings = measure_ceilings(device, lane.torch_dtype)
    artifacts, runners = {}, {}
    for backend in tqdm(backends, desc="artifacts", leave=False):
        artifacts[backend], _ = build_artifact(drafter, backend, buckets, artifacts_dir)
        runners[backend] = load_runner(artifacts[backend], device)
    # a backend that forces another dtype (onnx: fp32) is checked against its own host path
    same = {b: r for b, r in runners.items() if r.lane.dtype == lane.dtype}
    other = {b: r for b, r in runners.items() if b not in same}
    rows = []
    steps = tqdm(total=len(buckets) * (2 + len(backends)), desc="timing", leave=False)
    for batch in buckets:
        floor = round_floor(drafter, batch, context, ceilings)
        # decode rounds rewrite the same positions with the same rows: each repeat is the
        # same round, so repeats are comparable and every path ends in the same state
        prompt, decode = synthetic_rounds(lane, batch, context, 2, seed, device, fixed=True)
        comparisons = [Comparison(drafter, batch, same)]
        comparisons += [Comparison(r.drafter, batch, {b: r}, eager=False)
                        for b, r in other.items()]
        for index, comparison in enumerate(comparisons):
            comparison.round(prompt)
            calls, requests = comparison.calls(decode)
            reference = calls[HOST]()
            if index:  # the host row is the lane's own dtype's
                del calls[HOST]
            # greedy picks that a one-ulp change of a bf16 logit could flip: where a path
            # that sums in another order (the fused Markov step) could differ, if anywhere
            near_ties = int(reference.near_ties[requests].sum())
            runner_of = {runtime_path(b): r for b, r in comparison.runners.items()}
            for name, call in calls.items():
                ms = time_ms(call, device, repeats, warmup)
                # a runner's round less its step alone: the host's part of the round
                replay = (significant(time_ms(lambda: runner_of[name].replay(batch), device,
                                              repeats, warmup)) if name in runner_of else None)
                out = call()
                identical = ("reference" if name == HOST else
                             comparison.agreement[name].check(out, reference, requests))
                d2h = (reference.transfers.d2h_bytes if name == HOST
                       else runner_of[name].download_bytes(batch) if name in runner_of
                       else batch * lane.k * 12)  # int64 ids and float32 confidences
                graphs, kernels = launches(call, device)  # after timing: the profiler costs
                rows.append(dict(lane=lane.name, batch=batch, path=name, ms=significant(ms),
                                 replay_ms=replay, vs_host=None, vs_floor=significant(ms / floor.ms),
                                 identical=identical, near_ties=near_ties, d2h_bytes=d2h,
                                 graphs=graphs, kernels=kernels,
                                 floor_ms=significant(floor.ms), floor_bytes=floor.bytes,
                                 floor_flops=floor.flops,
                                 logits_ms=significant(floor.logits_ms)))
                steps.update()
            comparison.release()
        host_ms = next(r["ms"] for r in rows if r["batch"] == batch and r["path"] == HOST)
        for r in rows:
            if r["batch"] == batch:
                r["vs_host"] = significant(host_ms / r["ms"])
    steps.close()
    return dict(lane=lane.to_dict(), context=context, repeats=repeats, warmup=warmup,
                env=environment(device), ceilings=asdict(ceilings),
                artifacts={b: str(p) for b, p in artifacts.items()},
                load_seconds={b: r.load_seconds for b, r in runners.items()}, rows=rows)


def bench(config: BenchConfig) -> Path:
    """Run one benchmark, print its table, write its JSON and PNG; returns the JSON path."""
    print(f"lane {config.lane.name}, backends {config.backends}, buckets {config.buckets}, "
          f"context {config.context}, device {config.device}", flush=True)
    result = run_bench(make_drafter(config), config.backends, config.buckets, config.context,
                       config.artifacts_dir, config.repeats, config.warmup, config.seed)
    bandwidth, matmul = result["ceilings"]["bandwidth"], result["ceilings"]["matmul"]
    print(f"measured now: copy {bandwidth / 1e9:.3g} GB/s, matmul {matmul / 1e12:.3g} TFLOP/s"
          + (" (on the CPU, caches make the floor indicative only)"
             if config.device == "cpu" else ""))
    print_table([{k: r[k] for k in COLUMNS} for r in result["rows"]])
    print("load_runner: " + ", ".join(f"{backend} {phases['total']:.2f} s"
                                      for backend, phases in result["load_seconds"].items()))
    stem = f"bench_{config.lane.name}_{result['env']['device_type']}"
    json_path, png_path = write(result, config.out_dir, stem)
    print(json_path)
    print(png_path)
    return json_path
