"""Token identity of a loaded artifact against the host path, on seeded multi-round inputs.

For each bucket b the runner drafts for b-1 requests (so a padded row is exercised; 1 for
b = 1); the host path sees the same padded batch, so both run the same shapes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from dspark_compile.backends import get_backend
from dspark_compile.draft import KVCache
from dspark_compile.reference import HostPath
from dspark_compile.rounds import synthetic_rounds
from dspark_compile.runtime import load_runner


def verify_artifact(artifact_dir: str | Path, device: str = "cpu", rounds: int = 4,
                    context: int = 24, seed: int = 0) -> dict[str, Any]:
    runner = load_runner(artifact_dir, device)
    lane = runner.lane
    host = HostPath(runner.drafter)
    # ids are always compared exactly; confidences exactly unless the backend's GEMMs
    # round differently from torch's (ONNX: onnxruntime's fp32 kernels)
    tolerance = getattr(get_backend(runner.manifest["backend"]), "CONFIDENCE_TOLERANCE", 0.0)
    report: dict[str, Any] = {"identical": True, "artifact": str(artifact_dir),
                              "backend": runner.manifest["backend"], "lane": lane.name,
                              "device": device, "rounds": 0, "tokens_compared": 0,
                              "near_ties": 0, "confidence_tolerance": tolerance,
                              "first_mismatch": None}
    for bucket in runner.buckets:
        batch = max(1, bucket - 1)
        host_cache = KVCache.allocate(lane, bucket, device)
        for index, inputs in enumerate(synthetic_rounds(lane, batch, context, rounds,
                                                        seed + bucket, device)):
            out = runner.draft(inputs)
            ref = host.draft(host_cache, runner.pad(inputs, bucket))
            ids, confidences = out.ids.cpu(), out.confidences.cpu()
            report["rounds"] += 1
            report["tokens_compared"] += ids.numel()
            report["near_ties"] += int(ref.near_ties[:batch].sum())
            same = (ids == ref.ids[:batch]) & (
                (confidences - ref.confidences[:batch]).abs() <= tolerance)
            if report["identical"] and not bool(same.all()):
                row, step = (int(i) for i in (~same).nonzero()[0])
                report["identical"] = False
                report["first_mismatch"] = {
                    "bucket": bucket, "round": index, "row": row, "step": step,
                    "id": int(ids[row, step]), "host_id": int(ref.ids[row, step]),
                    "confidence": float(confidences[row, step]),
                    "host_confidence": float(ref.confidences[row, step])}
    return report


if __name__ == "__main__":
    from dspark_compile.cli import verify_main

    verify_main()
