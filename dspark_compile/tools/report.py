"""How results are shown: a table on stdout, a benchmark's JSON and its plot of ms per round
against batch, beside the floor."""

from __future__ import annotations

import json
from pathlib import Path


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


def print_table(rows: list[dict[str, object]]) -> None:
    """Rows of one shape as aligned columns on stdout."""
    header = list(rows[0])
    cells = [[f"{r[h]:.3f}" if isinstance(r[h], float) else str(r[h]) for h in header]
             for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(header)]
    for line in [header, *cells]:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip())
