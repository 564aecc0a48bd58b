"""A command's overrides composed before Hydra runs it, so that a composition error (a
misspelt key, an unknown lane or backend, a value of the wrong type) is a
:class:`ConfigError` of one line naming the field and what is allowed, not Hydra's
report."""

from __future__ import annotations

import dataclasses

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException, MissingConfigException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dspark_compile.config import CONF_DIR
from dspark_compile.errors import ConfigError


def check_overrides(config_name: str, overrides: list[str]) -> None:
    """Compose ``config_name`` with ``overrides``; :class:`ConfigError` if it fails."""
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            compose(config_name=config_name, overrides=overrides)
    except MissingConfigException as err:
        raise ConfigError(_missing_option(err)) from None
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(_one_line(config_name, err)) from None


def _missing_option(err: MissingConfigException) -> str:
    """``lane=tinyy: no such lane; allowed: ...``."""
    group, _, name = (err.missing_cfg_file or "").partition("/")
    allowed = ", ".join(err.options or [])
    return f"{group}={name}: no such {group}; allowed: {allowed}"


def _one_line(config_name: str, err: Exception) -> str:
    cause = err.__cause__ if isinstance(err.__cause__, OmegaConfBaseException) else err
    key = getattr(cause, "full_key", None)
    message = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
    if key and "not in" in message:  # a field the schema does not have
        return f"{key}: no such field; allowed: {', '.join(_fields(config_name, key))}"
    if key:
        return f"{key}: {message}"
    return message


def _fields(config_name: str, key: str) -> list[str]:
    """The fields of the node that holds ``key`` in ``config_name``'s schema."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        node = compose(config_name=config_name)
    for part in key.split(".")[:-1]:
        node = node[part]
    schema = OmegaConf.get_type(node)
    if schema is not None and dataclasses.is_dataclass(schema):
        return [f.name for f in dataclasses.fields(schema)]
    return sorted(node.keys())
