"""Reading a checkpoint's config.json into lane fields, noting where each value came from,
and the transformer config both formats share (transformers' ``Qwen3Config``).

A field the config.json has always wins over the lane. A field it leaves out takes the
value the format's own code would use (``Qwen3Config``'s defaults, the format's config
class's defaults), and says so; only fields no format records (dtype, capacities, the fast
paths) keep the lane's value.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from dspark_compile.config import LAYER_TYPES, SCALING_TYPES, LaneConfig, check_rope_scaling
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
# transformers 5.x LlamaConfig; head_dim None: hidden_size // num_attention_heads, and
# num_key_value_heads None: num_attention_heads (LlamaConfig's own rules)
LLAMA_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": None,
    "head_dim": None, "hidden_act": "silu", "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
    "rope_theta": 10000.0,
}
DEFAULTS = {"qwen3": QWEN3_DEFAULTS, "llama": LLAMA_DEFAULTS}


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

    def value(self, key: str, default: Any = REQUIRED, why: str = "",
              nullable: bool = True) -> tuple[Any, str]:
        """The config's value of ``key`` (or the format's default), and where it came from.
        A null reads as absent, unless the format's own config refuses it (``nullable``)."""
        if key in self.config and self.config[key] is None and not nullable:
            raise self.refuse(key, None, "an integer (the format's own config refuses null)")
        if key in self.config and self.config[key] is not None:
            return self.config[key], f"config.json {self.prefix}{key}"
        if default is REQUIRED:
            raise CheckpointError(f"config.json lacks {self.prefix}{key!r}{why}")
        return default, f"{self.origin} default ({self.prefix}{key}={default!r})"

    def take(self, field: str, key: str, default: Any = REQUIRED,
             convert: Callable[[Any], Any] = lambda v: v, nullable: bool = True) -> Any:
        """Set lane ``field`` from ``key``; returns the raw value."""
        value, source = self.value(key, default, nullable=nullable)
        self.put(field, convert(value), source)
        return value

    def put(self, field: str, value: Any, source: str) -> None:
        self.fields[field] = value
        self.sources[field] = source

    def refuse(self, key: str, value: Any, supported: str) -> CheckpointError:
        return CheckpointError(f"config.json {self.prefix}{key}={value!r}: {supported}")

    def lane(self, lane: LaneConfig) -> tuple[LaneConfig, dict[str, str]]:
        """``lane`` with the fields read, and the source of every lane field. A value the
        lane refuses is blamed on the config.json key it came from."""
        try:
            loaded = lane.replace(**self.fields)
        except ConfigError as err:
            refused = re.match(r"lane '[^']*': (\w+)=(.*)", str(err))
            if refused and refused[1] in self.sources:
                raise CheckpointError(f"{self.sources[refused[1]]}={refused[2]}") from None
            raise CheckpointError(str(err)) from None
        except (TypeError, ValueError) as err:
            raise CheckpointError(str(err)) from None
        sources = {name: self.sources.get(name, f"lane {lane.name!r}")
                   for name in lane.to_dict()}
        return loaded, sources


def read_transformer(r: Reading, model_types: tuple[str, ...] = ("qwen3",)) -> None:
    """The layer geometry, norm, activation, bias and RoPE of a transformer config of one
    of ``model_types``, with that config class's defaults. The formats build Qwen3 layers
    (q/k norms, an MLP without biases) whatever config class carries their fields."""
    model_type = r.config.get("model_type", "qwen3")
    if model_type not in model_types:
        raise r.refuse("model_type", model_type, f"supported: {', '.join(model_types)} (the "
                       f"{r.origin} drafter's layers are Qwen3 layers configured by it)")
    d = DEFAULTS[model_type]
    for field, key in [("hidden_size", "hidden_size"), ("num_layers", "num_hidden_layers"),
                       ("num_heads", "num_attention_heads"),
                       ("intermediate_size", "intermediate_size"),
                       ("target_vocab_size", "vocab_size"), ("rms_norm_eps", "rms_norm_eps"),
                       ("hidden_act", "hidden_act"), ("attention_bias", "attention_bias")]:
        r.take(field, key, d[key])
    heads = r.fields["num_heads"]
    if d["head_dim"] is None and r.config.get("head_dim") is None:
        size = r.fields["hidden_size"]
        r.put("head_dim", size // heads if isinstance(size, int) and isinstance(heads, int)
              and heads else size, f"{model_type} config: hidden_size // num_attention_heads")
    else:
        r.take("head_dim", "head_dim", d["head_dim"])
    # num_key_value_heads null (or a Llama config without it): one kv head per query head
    if r.config.get("num_key_value_heads") is None and (
            "num_key_value_heads" in r.config or d["num_key_value_heads"] is None):
        r.put("num_kv_heads", heads, f"{model_type} config: num_key_value_heads = "
              "num_attention_heads")
    else:
        r.take("num_kv_heads", "num_key_value_heads", d["num_key_value_heads"])
    read_rope(r, d)


def read_rope(r: Reading, defaults: dict[str, Any] = QWEN3_DEFAULTS) -> None:
    """rope_theta and rope_scaling, as transformers 5.x resolves them: ``rope_parameters``,
    else the older ``rope_scaling``; ``rope_theta`` inside it, else at the top level. What
    transformers' Qwen3 rotary embedding ignores is ignored here too, and named in the
    field's source."""
    key = "rope_parameters" if r.config.get("rope_parameters") is not None else "rope_scaling"
    params = r.config.get(key) or {}
    if not isinstance(params, dict):
        raise r.refuse(key, params, "expected an object")
    params, notes = dict(params), []
    if set(LAYER_TYPES) & set(params):
        # speculators' flatten_rope_parameters: the sliding_attention RoPE for every layer;
        # transformers' Qwen3 rotary embedding (DeepSpec's) reads no nesting
        if r.origin != "speculators" or not isinstance(params.get("sliding_attention"), dict):
            raise r.refuse(key, params, f"{r.origin} builds one Qwen3 rotary embedding from "
                           "it, which reads no per-layer-type nesting (speculators takes the "
                           "sliding_attention entry, when there is one); supported: one RoPE")
        notes.append("the sliding_attention entry for every layer, as speculators does")
        params = dict(params["sliding_attention"])
    if "rope_theta" in params:
        theta, source = params.pop("rope_theta"), f"config.json {r.prefix}{key}.rope_theta"
    else:
        theta, source = r.value("rope_theta", defaults["rope_theta"])
    r.put("rope_theta", theta, source)
    kind = params.pop("rope_type", params.pop("type", "default"))
    params.pop("type", None)
    partial = params.pop("partial_rotary_factor", r.config.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        if kind != "default":
            raise r.refuse("partial_rotary_factor", partial, f"with rope_type {kind!r}, "
                           "transformers' Qwen3 rotary embedding makes frequencies for part "
                           "of head_dim and then rotates all of it: the format's own forward "
                           "fails on the shapes; supported: 1.0, or rope_type default")
        notes.append(f"partial_rotary_factor={partial} ignored: the Qwen3 layers' default "
                     "RoPE rotates every dimension")
    origin = f"config.json {r.prefix}{key}" if key in r.config else \
        f"{r.origin} default (plain RoPE)"
    if kind == "default":
        unused = sorted(params)
        scaling = None
    else:
        if kind in ("llama3", "yarn", "dynamic"):
            # transformers: a top-level original_max_position_embeddings wins, else the
            # model's max_position_embeddings
            top, _ = r.value("original_max_position_embeddings", None)
            longest, _ = r.value("max_position_embeddings", defaults["max_position_embeddings"])
            if top is not None:
                params["original_max_position_embeddings"] = top
            params.setdefault("original_max_position_embeddings", longest)
            if kind == "yarn" and params.get("factor") is None:
                params["factor"] = longest / params["original_max_position_embeddings"]
        known = set().union(*SCALING_TYPES.get(kind, (set(params),)))
        unused = sorted(set(params) - known)
        scaling = {"rope_type": kind, **{k: v for k, v in params.items() if k in known}}
        try:
            check_rope_scaling(scaling)
        except ConfigError as err:
            raise CheckpointError(f"config.json {r.prefix}{key}: {err}") from None
    if unused:
        notes.append(f"{', '.join(unused)} ignored: rope_type {kind} does not use them")
    r.put("rope_scaling", scaling, origin + "".join(f"; {note}" for note in notes))


def read_heads(r: Reading, defaults: dict[str, Any]) -> None:
    """The Markov and confidence heads: ``markov_rank`` 0 builds no Markov head (and needs
    no ``markov_head_type``), ``enable_confidence_head`` false no confidence head (and
    needs no ``confidence_head_with_markov``). ``defaults``: the format's, for the keys it
    does not require."""
    rank = r.take("markov_rank", "markov_rank", defaults.get("markov_rank", REQUIRED))
    if rank:
        r.take("markov_head", "markov_head_type", defaults.get("markov_head_type", REQUIRED))
    else:
        r.put("markov_head", "vanilla", "config.json markov_rank=0 (no Markov head)")
    if r.take("confidence_head", "enable_confidence_head",
              defaults.get("enable_confidence_head", REQUIRED)):
        r.take("confidence_with_markov", "confidence_head_with_markov",
               defaults.get("confidence_head_with_markov", REQUIRED))
    else:
        r.put("confidence_with_markov", False, "config.json enable_confidence_head=false "
              "(no confidence head)")


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
