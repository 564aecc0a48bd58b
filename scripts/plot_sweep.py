"""Plots of a dspark-sweep results table: per lane, latency against batch size for every
path (the roofline floor dashed), the ratio to the floor, and the speed-up over the host
path; one line per path and context.

    python scripts/plot_sweep.py sweeps/<date>/results.jsonl [--out sweep.png]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

PANELS = [("ms", "ms per draft round", "log"),
          ("vs_floor", "time / roofline floor", "log"),
          ("vs_host", "speed-up over the host path", "log")]


def load(table: Path) -> list[dict]:
    return [row for row in map(json.loads, table.read_text().splitlines())
            if row["status"] == "ok"]


def series(rows: list[dict], lane: str, key: str) -> dict[tuple[str, int], dict[int, float]]:
    """(path, context) -> batch -> value. Host and eager rows appear in every job of a
    (lane, context); their median across jobs is drawn."""
    values: dict[tuple[str, int], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        if row["lane"] == lane:
            values[row["path"], row["context"]][row["batch"]].append(row[key])
    return {line: {b: statistics.median(v) for b, v in sorted(points.items())}
            for line, points in sorted(values.items())}


def plot(rows: list[dict], out: Path) -> None:
    lanes = sorted({row["lane"] for row in rows})
    contexts = sorted({row["context"] for row in rows})
    styles = {context: style for context, style in zip(contexts, ["-", "--", ":", "-."] * 4)}
    colors: dict[str, str] = {}
    fig, axes = plt.subplots(len(lanes), len(PANELS), figsize=(6 * len(PANELS), 4 * len(lanes)),
                             squeeze=False)
    for axes_row, lane in zip(axes, lanes):
        batches = sorted({row["batch"] for row in rows if row["lane"] == lane})
        for ax, (key, label, scale) in zip(axes_row, PANELS):
            for (path, context), points in series(rows, lane, key).items():
                if key != "ms" and path == "host":
                    continue  # 1 by definition, or not a compiled path
                color = colors.setdefault(path, f"C{len(colors)}")
                ax.plot(list(points), list(points.values()), styles[context], marker="o",
                        color=color, label=f"{path}, context {context}")
            if key == "ms":
                for context in contexts:
                    floor = series(rows, lane, "floor_ms").get(("host", context), {})
                    ax.plot(list(floor), list(floor.values()), styles[context], color="k",
                            marker="_", linewidth=1, label=f"floor, context {context}")
            if key == "vs_floor":
                ax.axhline(1.0, color="k", linewidth=1)
            ax.set_xscale("log")
            ax.set_xticks(batches, [str(b) for b in batches])
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set(yscale=scale, xlabel="batch (requests)", ylabel=label, title=f"{lane}: {label}")
            ax.grid(True, which="both", alpha=0.3)
        axes_row[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", type=Path, help="results.jsonl of a sweep")
    parser.add_argument("--out", type=Path, help="PNG path (default: sweep.png beside the table)")
    args = parser.parse_args()
    rows = load(args.table)
    if not rows:
        raise SystemExit(f"{args.table}: no successful jobs to plot")
    out = args.out or args.table.with_name("sweep.png")
    plot(rows, out)
    print(out)


if __name__ == "__main__":
    main()
