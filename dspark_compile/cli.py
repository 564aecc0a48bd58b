"""Hydra entry points."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from dspark_compile.checkpoint import load_checkpoint, random_drafter
from dspark_compile.config import CONF_DIR, Config, register_configs
from dspark_compile.draft import KVCache, draft
from dspark_compile.model import Drafter
from dspark_compile.reference import HostPath
from dspark_compile.rounds import context_needed, synthetic_rounds

register_configs()


def build_drafter(cfg: Config) -> Drafter:
    if cfg.checkpoint:
        return load_checkpoint(cfg.checkpoint, cfg.lane, cfg.device)
    return random_drafter(cfg.lane, cfg.device, cfg.seed)


def timed(fn: Callable[[], object], device: torch.device) -> tuple[object, float]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, (time.perf_counter() - start) * 1e3


def compare_paths(cfg: Config) -> list[dict[str, object]]:
    """Run seeded rounds through the device path and the host path; one row per path."""
    device = torch.device(cfg.device)
    drafter = build_drafter(cfg)
    lane = drafter.lane  # a checkpoint's config.json may have changed the geometry
    capacity = context_needed(lane, cfg.context, cfg.rounds)
    device_cache = KVCache.allocate(lane, cfg.batch, device, capacity)
    host_cache = device_cache.clone()
    host = HostPath(drafter)
    identical, device_ms, host_ms, host_bytes = True, [], [], []
    for inputs in synthetic_rounds(lane, cfg.batch, cfg.context, cfg.rounds, cfg.seed, device):
        out, ms = timed(lambda: draft(drafter, device_cache, inputs), device)
        device_ms.append(ms)
        ref, ms = timed(lambda: host.draft(host_cache, inputs), device)
        host_ms.append(ms)
        host_bytes.append(ref.transfers.d2h_bytes)
        identical &= torch.equal(out.ids.cpu(), ref.ids)
        identical &= torch.equal(out.confidences.cpu(), ref.confidences)
    # round 0 carries the prompt; the rounds after it are the steady state
    steady = slice(1, None) if cfg.rounds > 1 else slice(None)
    row = dict(lane=lane.name, batch=cfg.batch)
    return [
        dict(row, path="host", identical="reference", d2h_bytes=host_bytes[-1],
             ms=statistics.median(host_ms[steady])),
        dict(row, path="device (eager)", identical=identical,
             d2h_bytes=cfg.batch * lane.k * (8 + 4), ms=statistics.median(device_ms[steady])),
    ]


def print_table(rows: list[dict[str, object]]) -> None:
    header = ["lane", "batch", "path", "identical", "d2h_bytes", "ms"]
    cells = [[f"{r[h]:.3f}" if isinstance(r[h], float) else str(r[h]) for h in header]
             for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(header)]
    for line in [header, *cells]:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths)))


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def compile_main(cfg: DictConfig) -> None:
    config: Config = OmegaConf.to_object(cfg)
    print(f"lane {config.lane.name}, backend {config.backend.name}, device {config.device}, "
          f"batch {config.batch}, context {config.context}, rounds {config.rounds}")
    rows = compare_paths(config)
    print_table(rows)
    if not all(r["identical"] in (True, "reference") for r in rows):
        raise SystemExit("device path and host path disagree")
