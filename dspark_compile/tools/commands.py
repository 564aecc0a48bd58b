"""The schemas of the commands (``dspark-compile``, ``dspark-verify``, ``dspark-bench``),
checked whole when a command's config is composed, before any compile or device work, and
the drafter a command runs."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING, DictConfig, OmegaConf

from dspark_compile.checkpoint import describe_sources, load_checkpoint, random_drafter
from dspark_compile.compile.backends import REGISTRY
from dspark_compile.config import LaneConfig, check_device
from dspark_compile.errors import ConfigError
from dspark_compile.model import Drafter


def _require(ok: bool, name: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{name}={value!r}; allowed: {allowed}")


def _check_buckets(buckets: list[int], lane: LaneConfig) -> None:
    _require(bool(buckets) and all(1 <= b <= lane.max_batch for b in buckets), "buckets",
             buckets, f"one or more batch sizes in [1, lane.max_batch={lane.max_batch}]")


@dataclass
class BackendConfig:
    name: str = "eager"


@dataclass
class Config:
    """One run of ``dspark-compile``: a lane, a backend, and what to check it on."""

    lane: LaneConfig = MISSING
    backend: BackendConfig = MISSING
    device: str = "cpu"
    checkpoint: Optional[str] = None  # a DeepSpec or speculators directory; else seeded weights
    verifier: Optional[str] = None  # the target: tensors a speculators checkpoint omits
    buckets: list[int] = field(default_factory=lambda: [1, 4])  # batch sizes compiled
    artifacts_dir: str = "artifacts"
    seed: int = 0
    batch: int = 3
    context: int = 64  # prompt length of the first round
    rounds: int = 4

    def __post_init__(self) -> None:
        check_device(self.device)
        _check_buckets(self.buckets, self.lane)
        _require(1 <= self.batch <= max(self.buckets), "batch", self.batch,
                 f"[1, the largest bucket {max(self.buckets)}]")
        for name in ("context", "rounds"):
            _require(getattr(self, name) >= 1, name, getattr(self, name), ">= 1")
        _require(self.verifier is None or self.checkpoint is not None, "verifier",
                 self.verifier, "only with checkpoint= (it supplies tensors a speculators "
                 "checkpoint leaves out)")


@dataclass
class BenchConfig:
    """One run of ``dspark-bench``: paths timed side by side at each batch bucket."""

    lane: LaneConfig = MISSING
    backends: list[str] = field(default_factory=lambda: ["eager"])
    buckets: list[int] = field(default_factory=lambda: [1, 4])
    context: int = 256  # tokens of context each request has when the timed round runs
    device: str = "cpu"
    checkpoint: Optional[str] = None
    verifier: Optional[str] = None
    artifacts_dir: str = "artifacts"
    out_dir: str = "bench_out"
    repeats: int = 20
    warmup: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        check_device(self.device)
        _check_buckets(self.buckets, self.lane)
        unknown = [b for b in self.backends if b not in REGISTRY]
        _require(not unknown, "backends", self.backends, f"names from {sorted(REGISTRY)}")
        _require(self.context >= 1, "context", self.context, ">= 1")
        _require(self.repeats >= 1, "repeats", self.repeats, ">= 1")
        _require(self.warmup >= 0, "warmup", self.warmup, ">= 0")


@dataclass
class VerifyConfig:
    """One run of ``dspark-verify``: an artifact and the seeded rounds to check it on."""

    artifact: str = MISSING
    device: str = "cpu"
    rounds: int = 4
    context: int = 24
    seed: int = 0
    temperature: float = 0.0  # > 0: half the rows sample at this temperature
    record: Optional[str] = None  # write the rounds here (safetensors) instead of checking
    replay: Optional[str] = None  # check these outputs of the rounds of `record` instead

    def __post_init__(self) -> None:
        check_device(self.device)
        _require(self.record is None or self.replay is None, "record", self.record,
                 "unset when replay is set")
        for name in ("context", "rounds"):
            _require(getattr(self, name) >= 1, name, getattr(self, name), ">= 1")
        _require(math.isfinite(self.temperature) and self.temperature >= 0, "temperature",
                 self.temperature, "a finite number >= 0")


def make_drafter(config: Config | BenchConfig) -> Drafter:
    """The drafter a command runs: its checkpoint (saying where each lane field came
    from), else seeded random weights."""
    if config.checkpoint:
        drafter = load_checkpoint(config.checkpoint, config.lane, config.device,
                                  config.verifier)
        print(f"checkpoint {config.checkpoint}: {describe_sources(drafter.sources)}",
              flush=True)
        return drafter
    return random_drafter(config.lane, config.device, config.seed)


def to_config(cfg: DictConfig) -> Any:
    """A composed config as its schema's dataclass, validated. A key the schema does not
    have (``+lane.typo=1``) is a :class:`ConfigError`: Hydra's ``+`` adds keys a schema
    would otherwise drop in silence."""
    unknown = _unknown_keys(cfg, "")
    if unknown:
        raise ConfigError(f"unknown fields {unknown}: not in the schema (a misspelt "
                          "name, or a '+' that added it)")
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"{', '.join(missing)}: required; pass {missing[0]}=<value>")
    return OmegaConf.to_object(cfg)


def _unknown_keys(node: DictConfig, prefix: str) -> list[str]:
    schema = OmegaConf.get_type(node)
    if schema is None or not dataclasses.is_dataclass(schema):
        return []  # a free-form dict (lane.rope_scaling)
    names = {f.name for f in dataclasses.fields(schema)}
    unknown = []
    for key in node.keys():
        if key not in names:
            unknown.append(f"{prefix}{key}")
        elif not OmegaConf.is_missing(node, key) and isinstance(node[key], DictConfig):
            unknown += _unknown_keys(node[key], f"{prefix}{key}.")
    return unknown


def register_configs() -> None:
    """Register the schemas with Hydra's ConfigStore (the YAML under conf/ merges into them)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="schema", node=Config)
    cs.store(name="verify_schema", node=VerifyConfig)
    cs.store(name="bench_schema", node=BenchConfig)
