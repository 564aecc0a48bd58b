"""The validation curve of ``train.py --curve`` as a PNG: greedy tokens per round (exact,
teacher-forced on the held-out greedy answers) and the T = 1 estimate on the same answers
against training time.

    python scripts/testbed/plot_curve.py curve.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("curve", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="default: beside the JSON")
    args = parser.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(args.curve.read_text())
    curve, device = data["curve"], data.get("device_name")
    seconds = [point["seconds"] for point in curve]
    figure, axes = plt.subplots(figsize=(6, 4))
    axes.plot(seconds, [p["tokens_per_round"] for p in curve], "o-", label="greedy")
    axes.plot(seconds, [p["t1_tokens_per_round_estimate"] for p in curve], "s--",
              label="T = 1 estimate (1 - TV on the greedy answers)")
    for point in curve:
        axes.annotate(str(point["step"]), (point["seconds"], point["tokens_per_round"]),
                      textcoords="offset points", xytext=(0, 6), fontsize=7, ha="center")
    axes.set_xlabel(f"training time{f' on one {device}' if device else ''} (s); labels: steps")
    axes.set_ylabel("tokens per round (bonus included)")
    axes.set_title("held-out prompts' greedy answers, every position an anchor")
    axes.grid(alpha=0.3)
    axes.legend()
    out = args.out or args.curve.with_suffix(".png")
    figure.tight_layout()
    figure.savefig(out, dpi=120)
    print(out)


if __name__ == "__main__":
    main()
