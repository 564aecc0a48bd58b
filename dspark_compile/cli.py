"""Hydra entry points: ``dspark-compile``, ``dspark-verify``, ``dspark-bench`` and
``dspark-sweep``. Each composes its config, checks it against its schema and hands it to
its job in :mod:`dspark_compile.tools`; nothing imports this module."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
from typing import Callable

import hydra
from omegaconf import DictConfig

from dspark_compile.config import CONF_DIR
from dspark_compile.errors import DSparkError
from dspark_compile.progress import interrupt
from dspark_compile.tools.bench import bench
from dspark_compile.tools.commands import VerifyConfig, register_configs, to_config
from dspark_compile.tools.compile_job import compile_job
from dspark_compile.tools.composition import check_overrides
from dspark_compile.tools.sweep import run_job
from dspark_compile.tools.verify import record_rounds, verify_artifact

register_configs()


def command(name: str, config_name: str, needs: tuple[str, str] | None = None
            ) -> Callable[[Callable[[DictConfig], None]], Callable[[], None]]:
    """A Hydra entry point whose typed errors end the process with status 2 and one line,
    ``<name>: <ErrorType>: <message>``; ``--debug`` (or ``DSPARK_DEBUG=1``, or Hydra's own
    ``HYDRA_FULL_ERROR=1``) shows the traceback instead. ``needs``: a module the command cannot start without, and the
    install command that brings it."""
    def wrap(body: Callable[[DictConfig], None]) -> Callable[[], None]:
        @hydra.main(config_path=str(CONF_DIR), config_name=config_name, version_base="1.3")
        def task(cfg: DictConfig) -> None:
            try:
                body(cfg)
            except DSparkError as err:
                if os.environ.get("HYDRA_FULL_ERROR") == "1":
                    raise
                print(f"{name}: {type(err).__name__}: {err}", file=sys.stderr)
                raise SystemExit(2) from None

        def main() -> None:
            if needs and not installed(needs[0]):
                print(f"{name}: MissingBackendError: {name} needs {needs[0]}: {needs[1]}",
                      file=sys.stderr)
                raise SystemExit(2)
            if "--debug" in sys.argv or os.environ.get("DSPARK_DEBUG") == "1":
                if "--debug" in sys.argv:
                    sys.argv.remove("--debug")
                os.environ["HYDRA_FULL_ERROR"] = "1"
            signal.signal(signal.SIGINT, interrupt)
            try:
                overrides = sys.argv[1:]
                if not any(arg.startswith("-") for arg in overrides):  # flags: Hydra's own
                    check_overrides(config_name, overrides)
                task()
            except DSparkError as err:  # composition errors, before Hydra runs
                if os.environ.get("HYDRA_FULL_ERROR") == "1":
                    raise
                print(f"{name}: {type(err).__name__}: {err}", file=sys.stderr)
                raise SystemExit(2) from None
            except KeyboardInterrupt:
                if os.environ.get("HYDRA_FULL_ERROR") == "1":
                    raise
                print(f"{name}: interrupted", file=sys.stderr)
                raise SystemExit(130) from None
        return main
    return wrap


def installed(module: str) -> bool:
    """Whether ``module`` can be imported; a dotted name's missing parent package (a
    namespace such as ``hydra_plugins`` that nothing installed) says no, not raises."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


@command("dspark-compile", "config")
def compile_main(cfg: DictConfig) -> None:
    compile_job(to_config(cfg))


@command("dspark-verify", "verify")
def verify_main(cfg: DictConfig) -> None:
    """One JSON line, also when the artifact cannot be checked (then with its error)."""
    try:
        config: VerifyConfig = to_config(cfg)
        if config.record is not None:
            print(json.dumps(record_rounds(config.artifact, config.record, config.device,
                                           config.rounds, config.context, config.seed,
                                           config.temperature)))
            return
        report = verify_artifact(config.artifact, config.device, config.rounds,
                                 config.context, config.seed, config.temperature,
                                 config.replay)
    except DSparkError as err:
        print(json.dumps({"identical": False, "error": f"{type(err).__name__}: {err}"}))
        raise
    print(json.dumps(report))
    if not report["identical"]:
        raise SystemExit(1)


@command("dspark-bench", "bench")
def bench_main(cfg: DictConfig) -> None:
    bench(to_config(cfg))


@command("dspark-sweep", "sweep", needs=("hydra_plugins.hydra_joblib_launcher",
                                         "pip install 'dspark-compile[sweep]'"))
def sweep_main(cfg: DictConfig) -> None:
    run_job(cfg)
