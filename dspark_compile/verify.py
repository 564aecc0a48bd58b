"""Token identity of a loaded artifact against the host path, on seeded multi-round inputs.

For each bucket b the runner drafts for b-1 requests where that still selects bucket b (so
an inert row is exercised), else b; the host path sees the same bucket-sized batch, so both
run the same shapes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


from dspark_compile.backends import get_backend
from dspark_compile.draft import KVCache
from dspark_compile.reference import HostPath
from dspark_compile.rounds import synthetic_rounds
from dspark_compile.runtime import load_runner


def verify_artifact(artifact_dir: str | Path, device: str = "cpu", rounds: int = 4,
                    context: int = 24, seed: int = 0, temperature: float = 0.0
                    ) -> dict[str, Any]:
    """``temperature`` > 0 samples half the rows (see :func:`synthetic_rounds`)."""
    runner = load_runner(artifact_dir, device)
    lane = runner.lane
    host = HostPath(runner.drafter)
    # ids are always compared exactly; confidences exactly unless the backend's GEMMs
    # round differently from torch's (ONNX: onnxruntime's fp32 kernels)
    tolerance = getattr(get_backend(runner.manifest["backend"]), "CONFIDENCE_TOLERANCE", 0.0)
    report: dict[str, Any] = {"identical": True, "artifact": str(artifact_dir),
                              "backend": runner.manifest["backend"], "lane": lane.name,
                              "device": device, "temperature": temperature,
                              "buckets": runner.buckets, "rounds": rounds,  # per bucket
                              "tokens_compared": 0,
                              "near_ties": 0, "confidence_tolerance": tolerance,
                              "first_mismatch": None}
    smaller = 0
    for bucket in runner.buckets:
        batch, smaller = max(bucket - 1, smaller + 1), bucket
        slots = [runner.admit() for _ in range(batch)]
        host_cache = KVCache.allocate(lane, bucket, device)
        for index, inputs in enumerate(synthetic_rounds(lane, batch, context, rounds,
                                                        seed + bucket, device, temperature)):
            out = runner.draft(inputs, slots)
            full, rows = runner.layout(inputs, slots)
            ref = host.draft(host_cache, full)
            ids, confidences, rows = out.ids.cpu(), out.confidences.cpu(), rows.cpu()
            report["tokens_compared"] += ids.numel()
            report["near_ties"] += int(ref.near_ties[rows].sum())
            same = (ids == ref.ids[rows]) & (
                (confidences - ref.confidences[rows]).abs() <= tolerance)
            if report["identical"] and not bool(same.all()):
                row, step = (int(i) for i in (~same).nonzero()[0])
                report["identical"] = False
                report["first_mismatch"] = {
                    "bucket": bucket, "round": index, "row": row, "step": step,
                    "id": int(ids[row, step]), "host_id": int(ref.ids[rows[row], step]),
                    "confidence": float(confidences[row, step]),
                    "host_confidence": float(ref.confidences[rows[row], step])}
        for slot in slots:
            runner.release(slot)
    return report


if __name__ == "__main__":
    from dspark_compile.cli import verify_main

    verify_main()
