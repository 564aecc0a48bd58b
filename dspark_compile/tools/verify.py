"""``dspark-verify``: token identity of a loaded artifact against the host path, on seeded
multi-round inputs.

For each bucket b the runner drafts for b-1 requests where that still selects bucket b (so
an inert row is exercised), else b; the host path sees the same bucket-sized batch, so both
run the same shapes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dspark_compile.runtime import load_runner
from dspark_compile.tools.compare import Comparison, runtime_path
from dspark_compile.tools.rounds import synthetic_rounds


def verify_artifact(artifact_dir: str | Path, device: str = "cpu", rounds: int = 4,
                    context: int = 24, seed: int = 0, temperature: float = 0.0
                    ) -> dict[str, Any]:
    """``temperature`` > 0 samples half the rows (see :func:`synthetic_rounds`)."""
    runner = load_runner(artifact_dir, device)
    backend = runner.manifest["backend"]
    near_ties, agreements, smaller = 0, [], 0
    for bucket in runner.buckets:
        batch, smaller = max(bucket - 1, smaller + 1), bucket
        comparison = Comparison(runner.drafter, batch, {backend: runner}, eager=False)
        for index, inputs in enumerate(synthetic_rounds(runner.lane, batch, context, rounds,
                                                        seed + bucket, device, temperature)):
            comparison.round(inputs, bucket=bucket, round=index)
        comparison.release()
        near_ties += comparison.near_ties
        agreements.append(comparison.agreement[runtime_path(backend)])
    mismatched = [a for a in agreements if not a.identical]
    return {"identical": not mismatched, "artifact": str(artifact_dir), "backend": backend,
            "lane": runner.lane.name, "device": device, "temperature": temperature,
            "buckets": runner.buckets, "rounds": rounds,  # per bucket
            "tokens_compared": sum(a.tokens_compared for a in agreements),
            "near_ties": near_ties,
            "confidence_tolerance": agreements[0].confidence_tolerance,
            "first_mismatch": mismatched[0].first_mismatch if mismatched else None,
            "load_seconds": runner.load_seconds}
