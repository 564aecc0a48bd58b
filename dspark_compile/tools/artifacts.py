"""``dspark-artifacts``: what the artifact cache holds, and cleaning it.

``list`` shows each artifact (key, lane, backend, buckets, device, size, and whether this
environment can load it: ``current``, ``stale`` with what differs, ``damaged`` or
``partial``); it reads manifests, not every file's sha256 (a load still checks those).
``clean`` removes every artifact, or with ``--stale`` those this environment cannot load;
``--caches`` also empties the Inductor and Triton caches that builds fill.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from dspark_compile.compile.key import FORMAT_VERSION, environment
from dspark_compile.compile.store import MANIFEST


@dataclass
class Entry:
    path: Path
    state: str  # current | stale: ... | damaged: ... | partial
    manifest: Optional[dict] = None

    @property
    def size(self) -> int:
        return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file())


def entries(root: Path) -> list[Entry]:
    """Every artifact under ``root`` (``<lane>-<hash>/<backend>/<buckets>/``), and the
    staging directories of builds that stopped midway."""
    found = []
    for path in sorted(p for p in root.glob("*/*/*") if p.is_dir()):
        if path.name.startswith("."):
            found.append(Entry(path, "partial"))
            continue
        try:
            manifest = json.loads((path / MANIFEST).read_text())
            found.append(Entry(path, _state(manifest), manifest))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            found.append(Entry(path, f"damaged: {type(err).__name__}"))
    return found


def _state(manifest: dict) -> str:
    if manifest["format_version"] != FORMAT_VERSION:
        return f"stale: format {manifest['format_version']}, this reads {FORMAT_VERSION}"
    device = manifest["env"]["device_type"]
    if device == "cuda" and not torch.cuda.is_available():
        return "stale: built for cuda, none here"
    running = environment(device)
    differs = [name for name, value in running.items() if manifest["env"].get(name) != value]
    return f"stale: {', '.join(differs)} differ" if differs else "current"


def list_artifacts(root: Path) -> str:
    rows = [("key", "lane", "backend", "buckets", "device", "MB", "state")]
    for entry in entries(root):
        m = entry.manifest or {}
        env = m.get("env", {})
        rows.append((m.get("key", "-")[:12], m.get("lane", {}).get("name", entry.path.name),
                     entry.path.parent.name, "-".join(map(str, m.get("buckets", []))) or "-",
                     env.get("gpu", env.get("device_type", "-")),
                     f"{entry.size / 1e6:.1f}", entry.state))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip()
                     for row in rows)


def clean(root: Path, stale_only: bool, caches: bool) -> list[str]:
    """Remove artifacts (``stale_only``: those not current) and, with ``caches``, the
    compiler caches builds fill; lines saying what went."""
    said = []
    for entry in entries(root):
        if stale_only and entry.state == "current":
            continue
        size = entry.size
        shutil.rmtree(entry.path)
        said.append(f"removed {entry.path} ({size / 1e6:.1f} MB, {entry.state})")
    for folder in sorted(root.glob("*/*"), reverse=True) + sorted(root.glob("*")):
        if folder.is_dir() and folder.name != ".locks" and not any(folder.iterdir()):
            folder.rmdir()
    if caches:
        for cache in compiler_caches():
            if cache.exists():
                shutil.rmtree(cache)
                said.append(f"removed {cache}")
    return said


def compiler_caches() -> list[Path]:
    """Inductor's cache and Triton's, where builds leave what they compiled."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    from dspark_compile.compile.backends.inductor import triton_caches

    return [Path(cache_dir()).resolve(), *sorted(triton_caches())]


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="dspark-artifacts", description=__doc__.split(
        "\n\n")[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("list", help="each artifact and whether it loads here")
    cleaning = commands.add_parser("clean", help="remove artifacts (and compiler caches)")
    cleaning.add_argument("--stale", action="store_true",
                          help="only those this environment cannot load")
    cleaning.add_argument("--caches", action="store_true",
                          help="also Inductor's and Triton's caches that builds fill")
    for sub in (listing, cleaning):
        sub.add_argument("--dir", default="artifacts", type=Path,
                         help="the artifact cache (artifacts_dir; default: artifacts)")
    args = parser.parse_args(argv)
    if not args.dir.is_dir():
        print(f"dspark-artifacts: no artifact cache at {args.dir}", file=sys.stderr)
        raise SystemExit(2)
    if args.command == "list":
        print(list_artifacts(args.dir))
    else:
        print("\n".join(clean(args.dir, args.stale, args.caches)) or "nothing to remove")
