"""The C++ runner against the Python runner on one aoti artifact, in one run: the seeded
rounds dspark-verify checks (half the rows sampled at T = 1, prompts of ``--context`` rows
through the compiled prefill) drafted by ``dspark-draft-cpp``, its outputs replayed against
the host path, compared bit for bit with the Python runner's, and the wall time of one
round in each runtime against the replay of its bucket's CUDA graph alone (the same graph:
what is left is each runtime's host work).

    python scripts/cpp_runner_check.py ARTIFACT --tool build/cpp/dspark-draft-cpp \
        --out cpp_check.json   # --device: cuda where this torch sees a GPU, else cpu

It writes only ``--out`` (the rounds and the C++ outputs live in a temporary folder). The
Python round and the replay are timed in alternation after a warm-up, and each runtime's
host work is the median of round minus replay, pair by pair.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from dspark_compile.runtime import load_runner
from dspark_compile.tools.verify import plan, record_rounds, verify_artifact


def wall_us(call, device: torch.device) -> float:
    start = time.perf_counter()
    call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) * 1e6


def paired_us(round_call, replay_call, device: torch.device, repeats: int
              ) -> tuple[list[float], list[float]]:
    """A round's and a replay's wall times, taken in turn after ``repeats // 10 + 1`` warm-up
    pairs, so that both see the same machine."""
    rounds, replays = [], []
    for i in range(repeats + repeats // 10 + 1):
        pair = wall_us(round_call, device), wall_us(replay_call, device)
        if i > repeats // 10:
            rounds.append(pair[0])
            replays.append(pair[1])
    return rounds, replays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("artifact")
    parser.add_argument("--tool", default="build/cpp/dspark-draft-cpp")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--context", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory(prefix="dspark-cpp-check-") as work:
        report, buckets = check(args, device, Path(work))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report))
    print(f"{'bucket':>6} {'same':>5} {'python us':>10} {'C++ us':>8} {'graph us':>9} "
          f"{'py host':>8} {'C++ host':>9}")
    for bucket, row in buckets.items():
        print(f"{bucket:>6} {str(row['cpp_identical_to_python_runner']):>5} "
              f"{row['python_round_us']:>10.1f} {row['cpp_round_us']:>8.1f} "
              f"{row['graph_replay_us']:>9.1f} {row['python_host_us']:>8.1f} "
              f"{row['cpp_host_us'] or float('nan'):>9.1f}")


def check(args: argparse.Namespace, device: torch.device, work: Path) -> tuple[dict, dict]:
    rounds_file, outputs_file = work / "cpp_rounds.safetensors", work / "cpp_outputs.safetensors"
    record_rounds(args.artifact, rounds_file, args.device, args.rounds, args.context, seed=0,
                  temperature=1.0)
    start = time.perf_counter()
    subprocess.run([args.tool, args.artifact, str(rounds_file), str(outputs_file), "--time",
                    str(args.repeats)], check=True)
    cpp_process_s = time.perf_counter() - start
    replay = verify_artifact(args.artifact, args.device, replay=outputs_file)

    drafted = load_file(str(outputs_file))
    with safe_open(str(outputs_file), framework="pt") as handle:
        metadata = handle.metadata()
    runner = load_runner(args.artifact, device)
    lane, buckets = runner.lane, {}
    for bucket, batch, inputs in plan(lane, runner.buckets, args.rounds, args.context, 0, 1.0,
                                      args.device):
        slots = [runner.admit() for _ in range(batch)]
        same = True
        for index, round_inputs in enumerate(inputs):
            out = runner.draft(round_inputs, slots)
            same &= torch.equal(out.ids, drafted[f"b{bucket}.r{index}.ids"])
            confidences = drafted.get(f"b{bucket}.r{index}.confidences")
            same &= (out.confidences is None and confidences is None) or (
                confidences is not None and torch.equal(out.confidences, confidences))
        # the bucket's bound step alone: its graph's replay, as both runtimes launch it
        python_us, graph_us = paired_us(lambda: runner.draft(inputs[-1], slots),
                                        lambda: runner.replay(batch), device, args.repeats)
        cpp_us = json.loads(metadata[f"b{bucket}.draft_us"])
        medians = {name: statistics.median(times) for name, times in
                   (("python_round_us", python_us), ("cpp_round_us", cpp_us),
                    ("graph_replay_us", graph_us))}
        buckets[bucket] = {
            "requests": batch, "cpp_identical_to_python_runner": bool(same), **medians,
            "python_host_us": statistics.median(r - g for r, g in zip(python_us, graph_us)),
            # the C++ rounds ran in another process: against this one's replay only where a
            # replay is one CUDA graph's (on the CPU the step's time moves between processes)
            "cpp_host_us": (medians["cpp_round_us"] - medians["graph_replay_us"]
                            if device.type == "cuda" else None)}
        for slot in slots:
            runner.release(slot)
    report = {"artifact": args.artifact, "lane": lane.name, "device": args.device,
              "rounds": args.rounds, "context": args.context, "repeats": args.repeats,
              "replay_identical": replay["identical"], "replay": replay,
              "cpp_process_s": round(cpp_process_s, 3),
              "cpp_load_s": float(metadata["load_s"]), "buckets": buckets,
              "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None}
    return report, buckets


if __name__ == "__main__":
    main()
