"""Reading a checkpoint's config.json into lane fields, noting where each value came from,
and the transformer config both formats share (transformers' ``Qwen3Config``).

A field the config.json has always wins over the lane. A field it leaves out takes the
value the format's own code would use (``Qwen3Config``'s defaults, the format's config
class's defaults), and says so; only fields no format records (dtype, capacities, the fast
paths) keep the lane's value.
"""

from __future__ import annotations

from typing import Any, Callable

from dspark_compile.config import LaneConfig, check_rope_scaling
from dspark_compile.errors import CheckpointError, ConfigError

REQUIRED = object()

# transformers 5.x Qwen3Config: what the formats' code reads where config.json has no value
QWEN3_DEFAULTS: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
    "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
    "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28,
    "rope_theta": 10000.0,  # PreTrainedConfig.default_theta
}


class Reading:
    """Lane fields read from one JSON object (``prefix`` names it inside config.json)."""

    def __init__(self, config: dict[str, Any], origin: str, prefix: str = ""):
        self.config, self.origin, self.prefix = config, origin, prefix
        self.fields: dict[str, Any] = {}
        self.sources: dict[str, str] = {}

    def at(self, prefix: str) -> "Reading":
        """A reading of the object under ``prefix`` that records into this one."""
        value = self.config.get(prefix, {})
        if not isinstance(value, dict):
            raise CheckpointError(f"config.json: {prefix} is not an object")
        inner = Reading(value, self.origin, f"{self.prefix}{prefix}.")
        inner.fields, inner.sources = self.fields, self.sources
        return inner

    def value(self, key: str, default: Any = REQUIRED, why: str = "") -> tuple[Any, str]:
        """The config's value of ``key`` (or the format's default), and where it came from."""
        if key in self.config and self.config[key] is not None:
            return self.config[key], f"config.json {self.prefix}{key}"
        if default is REQUIRED:
            raise CheckpointError(f"config.json lacks {self.prefix}{key!r}{why}")
        return default, f"{self.origin} default ({self.prefix}{key}={default!r})"

    def take(self, field: str, key: str, default: Any = REQUIRED,
             convert: Callable[[Any], Any] = lambda v: v) -> Any:
        """Set lane ``field`` from ``key``; returns the raw value."""
        value, source = self.value(key, default)
        self.put(field, convert(value), source)
        return value

    def put(self, field: str, value: Any, source: str) -> None:
        self.fields[field] = value
        self.sources[field] = source

    def refuse(self, key: str, value: Any, supported: str) -> CheckpointError:
        return CheckpointError(f"config.json {self.prefix}{key}={value!r}: {supported}")

    def lane(self, lane: LaneConfig, path: str) -> tuple[LaneConfig, dict[str, str]]:
        """``lane`` with the fields read, and the source of every lane field."""
        try:
            loaded = lane.replace(**self.fields)
        except (ConfigError, TypeError, ValueError) as err:
            raise CheckpointError(f"{path}: {err}") from None
        sources = {name: self.sources.get(name, f"lane {lane.name!r}")
                   for name in lane.to_dict()}
        return loaded, sources


def read_transformer(r: Reading) -> None:
    """The Qwen3 layer geometry, norm, activation, bias and RoPE of a transformer config."""
    d = QWEN3_DEFAULTS
    model_type = r.config.get("model_type", "qwen3")
    if model_type != "qwen3":
        raise r.refuse("model_type", model_type, "supported: qwen3 (the drafter's layers are "
                       "Qwen3 layers)")
    for field, key in [("hidden_size", "hidden_size"), ("num_layers", "num_hidden_layers"),
                       ("num_heads", "num_attention_heads"), ("head_dim", "head_dim"),
                       ("intermediate_size", "intermediate_size"),
                       ("target_vocab_size", "vocab_size"), ("rms_norm_eps", "rms_norm_eps"),
                       ("hidden_act", "hidden_act"), ("attention_bias", "attention_bias")]:
        r.take(field, key, d[key])
    # Qwen3Config: num_key_value_heads null means one kv head per query head
    heads = r.fields["num_heads"]
    if "num_key_value_heads" in r.config and r.config["num_key_value_heads"] is None:
        r.put("num_kv_heads", heads, f"config.json {r.prefix}num_key_value_heads=null "
              "(= num_attention_heads)")
    else:
        r.take("num_kv_heads", "num_key_value_heads", d["num_key_value_heads"])
    read_rope(r)


def read_rope(r: Reading) -> None:
    """rope_theta and rope_scaling, as transformers 5.x resolves them: ``rope_parameters``,
    else the older ``rope_scaling``; ``rope_theta`` inside it, else at the top level."""
    key = "rope_parameters" if r.config.get("rope_parameters") is not None else "rope_scaling"
    params = r.config.get(key) or {}
    if not isinstance(params, dict):
        raise r.refuse(key, params, "expected an object")
    params = dict(params)
    if {"full_attention", "sliding_attention"} & set(params):
        raise r.refuse(key, params, "supported: one RoPE for every layer")
    if "rope_theta" in params:
        theta, source = params.pop("rope_theta"), f"config.json {r.prefix}{key}.rope_theta"
    else:
        theta, source = r.value("rope_theta", QWEN3_DEFAULTS["rope_theta"])
    r.put("rope_theta", theta, source)
    kind = params.pop("rope_type", params.pop("type", "default"))
    params.pop("type", None)
    partial = params.pop("partial_rotary_factor", r.config.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise r.refuse("partial_rotary_factor", partial, "supported: 1.0 (Qwen3 rotates "
                       "every dimension)")
    if kind == "default":
        r.put("rope_scaling", None, f"config.json {r.prefix}{key}" if key in r.config
              else f"{r.origin} default (plain RoPE)")
        return
    if kind in ("llama3", "yarn"):
        # transformers: a top-level original_max_position_embeddings wins, else the
        # model's max_position_embeddings
        top, _ = r.value("original_max_position_embeddings", None)
        longest, _ = r.value("max_position_embeddings", QWEN3_DEFAULTS["max_position_embeddings"])
        if top is not None:
            params["original_max_position_embeddings"] = top
        params.setdefault("original_max_position_embeddings", longest)
        if kind == "yarn" and params.get("factor") is None:
            params["factor"] = longest / params["original_max_position_embeddings"]
    scaling = {"rope_type": kind, **params}
    try:
        check_rope_scaling(scaling)
    except ConfigError as err:
        raise CheckpointError(f"config.json {r.prefix}{key}: {err}") from None
    r.put("rope_scaling", scaling, f"config.json {r.prefix}{key}")


def transformer_config(lane: LaneConfig) -> dict[str, Any]:
    """The Qwen3Config fields of a lane, as transformers 5.x writes them."""
    rope = {"rope_type": "default", **(lane.rope_scaling or {}), "rope_theta": lane.rope_theta}
    types = [lane.layer_type(i) for i in range(lane.num_layers)]
    return {
        "model_type": "qwen3",
        "hidden_size": lane.hidden_size,
        "num_hidden_layers": lane.num_layers,
        "num_attention_heads": lane.num_heads,
        "num_key_value_heads": lane.num_kv_heads,
        "head_dim": lane.head_dim,
        "intermediate_size": lane.intermediate_size,
        "vocab_size": lane.target_vocab_size,
        "rms_norm_eps": lane.rms_norm_eps,
        "hidden_act": lane.hidden_act,
        "attention_bias": lane.attention_bias,
        "rope_parameters": rope,
        "tie_word_embeddings": False,
        "layer_types": types,
        "use_sliding_window": lane.has_sliding_layers,
        "sliding_window": lane.sliding_window,
    }


def describe_sources(sources: dict[str, str]) -> str:
    """One line: which lane fields came from config.json, from a format's defaults, and
    from the lane."""
    groups: dict[str, list[str]] = {"config.json": [], "defaults": []}
    for name, source in sources.items():
        if source.startswith("config.json"):
            groups["config.json"].append(name)
        elif source.startswith("lane "):
            groups.setdefault(source, []).append(name)
        else:
            groups["defaults"].append(f"{name} ({source})")
    return "; ".join(f"from {kind}: {', '.join(names)}" for kind, names in groups.items()
                     if names)
