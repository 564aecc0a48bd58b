"""``dspark-verify``: token identity of a loaded artifact against the host path, on seeded
multi-round inputs.

For each bucket b the runner drafts for b-1 requests where that still selects bucket b (so
an inert row is exercised), else b; the host path sees the same bucket-sized batch, so both
run the same shapes. ``record`` writes those rounds to a safetensors file instead, for
another runtime (``dspark-draft-cpp``) to draft; ``replay`` checks that runtime's outputs
against the host path as the runner's would be.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, Optional

from safetensors.torch import load_file, safe_open, save_file

from dspark_compile.compile.key import environment
from dspark_compile.compile.store import read_manifest
from dspark_compile.config import LaneConfig
from dspark_compile.draft import DraftOutput, RoundInputs
from dspark_compile.runtime import Runner, load_runner
from dspark_compile.tools.compare import Comparison, runtime_path
from dspark_compile.tools.rounds import synthetic_rounds

FIELDS = ("features", "num_new", "anchor", "anchor_pos", "temperature", "seed")


def plan(lane: LaneConfig, buckets: list[int], rounds: int, context: int, seed: int,
         temperature: float, device: str) -> Iterator[tuple[int, int, list[RoundInputs]]]:
    """Per bucket: the bucket, its request count and its rounds."""
    smaller = 0
    for bucket in buckets:
        batch, smaller = max(bucket - 1, smaller + 1), bucket
        yield bucket, batch, list(synthetic_rounds(lane, batch, context, rounds,
                                                   seed + bucket, device, temperature))


class Replayed:
    """The runner, but each round's outputs are the recorded ones of another runtime."""

    def __init__(self, runner: Runner, outputs: dict, bucket: int):
        self.runner, self.outputs, self.bucket_index, self.round = runner, outputs, bucket, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)

    def draft(self, inputs: RoundInputs, slots: list[int]) -> DraftOutput:
        prefix = f"b{self.bucket_index}.r{self.round}."
        self.round += 1
        return DraftOutput(self.outputs[prefix + "ids"], self.outputs.get(prefix + "confidences"))


def verify_artifact(artifact_dir: str | Path, device: str = "cpu", rounds: int = 4,
                    context: int = 24, seed: int = 0, temperature: float = 0.0,
                    replay: Optional[str | Path] = None) -> dict[str, Any]:
    """``temperature`` > 0 samples half the rows (see :func:`synthetic_rounds`). With
    ``replay`` (the outputs of rounds :func:`record_rounds` wrote), the recorded rounds'
    settings apply and their outputs are checked in place of the runner's."""
    runner = load_runner(artifact_dir, device)
    backend = runner.manifest["backend"]
    outputs = None
    if replay is not None:
        with safe_open(str(replay), framework="pt") as handle:
            settings = json.loads(handle.metadata()["settings"])
        rounds, context, seed, temperature = (settings[name] for name in
                                              ("rounds", "context", "seed", "temperature"))
        outputs = load_file(str(replay))
    near_ties, agreements = 0, []
    for bucket, batch, inputs in plan(runner.lane, runner.buckets, rounds, context, seed,
                                      temperature, device):
        path = runner if outputs is None else Replayed(runner, outputs, bucket)
        comparison = Comparison(runner.drafter, batch, {backend: path}, eager=False)
        for index, round_inputs in enumerate(inputs):
            comparison.round(round_inputs, bucket=bucket, round=index)
        comparison.release()
        near_ties += comparison.near_ties
        agreements.append(comparison.agreement[runtime_path(backend)])
    mismatched = [a for a in agreements if not a.identical]
    return {"identical": not mismatched, "artifact": str(artifact_dir), "backend": backend,
            "lane": runner.lane.name, "device": device, "temperature": temperature,
            "buckets": runner.buckets, "rounds": rounds,  # per bucket
            **({"replay": str(replay)} if replay is not None else {}),
            "tokens_compared": sum(a.tokens_compared for a in agreements),
            "near_ties": near_ties,
            "confidence_tolerance": agreements[0].confidence_tolerance,
            "first_mismatch": mismatched[0].first_mismatch if mismatched else None,
            "load_seconds": runner.load_seconds}


def record_rounds(artifact_dir: str | Path, path: str | Path, device: str = "cpu",
                  rounds: int = 4, context: int = 24, seed: int = 0,
                  temperature: float = 0.0) -> dict[str, Any]:
    """Write the rounds :func:`verify_artifact` checks to ``path``. Checks the artifact as
    a load does; loads no backend."""
    manifest = read_manifest(Path(artifact_dir), environment(device))
    lane = LaneConfig(**manifest["lane"])
    settings = {"rounds": rounds, "context": context, "seed": seed, "temperature": temperature}
    rounds_made = plan(lane, manifest["buckets"], rounds, context, seed, temperature, device)
    steps = save_rounds(path, list(rounds_made), device, settings)
    return {"recorded": str(path), "artifact": str(artifact_dir), "plan": steps, **settings}


def save_rounds(path: str | Path, rounds: list[tuple[int, int, list[RoundInputs]]],
                device: str, settings: dict[str, Any]) -> list[list[int]]:
    """``rounds`` (per bucket: the bucket, its requests, their rounds) as a safetensors
    file: tensors ``b<bucket>.r<round>.<input>``, and as metadata the device, the plan
    (``[[bucket, requests, rounds], ...]``) and ``settings``. Returns the plan."""
    tensors, steps = {}, []
    for bucket, batch, inputs in rounds:
        steps.append([bucket, batch, len(inputs)])
        for index, round_inputs in enumerate(inputs):
            for name, tensor in zip(FIELDS, round_inputs.tensors()):
                tensors[f"b{bucket}.r{index}.{name}"] = tensor.cpu().clone()  # rounds share some
    save_file(tensors, str(path), metadata={"device": device, "plan": json.dumps(steps),
                                            "settings": json.dumps(settings)})
    return steps
