"""The lane schema.

A *lane* is a drafter geometry (plus the knobs that change its arithmetic). Lanes live as
YAML under ``conf/lane/``; Hydra merges them into this schema (commands.py holds the
commands' own schemas), so a wrong type or an unknown key fails at compose time. The
runtime reads lanes from artifact manifests and never imports Hydra.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import torch

from dspark_compile.errors import ConfigError

CONF_DIR = Path(__file__).resolve().parent / "conf"


class MarkovHead(str, Enum):
    vanilla = "vanilla"
    gated = "gated"
    rnn = "rnn"


class Layout(str, Enum):
    # k rows [anchor, mask x (k-1)]; row i predicts position s+i+1
    anchor_first = "anchor_first"
    # k+1 rows [anchor, mask x k]; the k mask rows are kept
    one_plus_k = "one_plus_k"


FAST_PATHS = ("fused_markov_step", "fused_attention", "skinny_gemm")  # see for_device
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
          "float64": torch.float64}
# transformers' ACT2FN names
ACTIVATIONS = ("silu", "swish", "gelu", "gelu_new", "gelu_pytorch_tanh", "relu")
LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass
class LaneConfig:
    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    target_vocab_size: int
    draft_vocab_size: int
    k: int  # tokens drafted per round
    # target layers whose hidden states feed the context, -1 for the embedding output: the
    # features of a tap t are the target's hidden_states[t + 1]
    target_layer_ids: list[int]
    mask_token_id: int
    rope_theta: float = 1e6
    # None, or {rope_type: linear | llama3 | yarn, <its parameters>} (model/rope.py)
    rope_scaling: Optional[dict[str, Any]] = None
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    attention_bias: bool = False  # q/k/v/o projections carry biases
    markov_rank: int = 256  # 0: no Markov head, the ids are the base logits' argmax
    markov_head: MarkovHead = MarkovHead.vanilla
    confidence_head: bool = True  # false: no confidence head, a runner returns None
    # on CUDA, the Markov walk, the block's attention and the GEMMs of a few rows as Triton
    # kernels of our own (dspark_compile/kernels/). "auto": on where the device, dtype and
    # head support them (decided when a drafter is made on a device: for_device)
    fused_markov_step: Any = "auto"
    # the fused walk reads W2 only at columns that can still win (kernels/markov, up to 16
    # requests): the same ids, fewer bytes, but not yet less time (docs/internals.md)
    certified_markov_walk: bool = False
    fused_attention: Any = "auto"
    skinny_gemm: Any = "auto"
    confidence_with_markov: bool = True
    # STS: a temperature per draft position on the confidence's logit, applied in the step
    # (runtime/schedule.py fits them from recorded rounds); null: the head's own
    confidence_temperatures: Optional[list[float]] = None
    layout: Layout = Layout.anchor_first
    # per layer "full_attention" (all context, the block bidirectional) or
    # "sliding_attention" (the sliding_window context positions before the anchor, the
    # block causal when sliding_causal); empty: every layer full_attention
    layer_types: list[str] = field(default_factory=list)
    sliding_window: Optional[int] = None
    sliding_causal: bool = True
    dtype: str = "bfloat16"
    max_context: int = 4096  # largest anchor position a request may reach
    max_batch: int = 64

    def __post_init__(self) -> None:
        self.markov_head = MarkovHead(self.markov_head)
        self.layout = Layout(self.layout)
        self.target_layer_ids = list(self.target_layer_ids)
        self.layer_types = list(self.layer_types)
        if self.rope_scaling is not None:
            self.rope_scaling = dict(self.rope_scaling)
        if self.confidence_temperatures is not None:
            self.confidence_temperatures = list(self.confidence_temperatures)
        # types first: a lane can come from an untrusted config.json or manifest
        def integer(value: Any) -> bool:
            return isinstance(value, int) and not isinstance(value, bool)

        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "target_vocab_size", "draft_vocab_size", "k",
                     "markov_rank", "max_context", "max_batch"):
            value, least = getattr(self, name), 0 if name == "markov_rank" else 1
            if not integer(value) or value < least:
                raise ConfigError(f"lane {self.name!r}: {name}={value!r}, expected an "
                                  f"integer >= {least}")
        types = [("mask_token_id", integer(self.mask_token_id), "an integer"),
                 ("target_layer_ids", all(integer(i) and i >= -1 for i in self.target_layer_ids)
                  and len(set(self.target_layer_ids)) == len(self.target_layer_ids),
                  "distinct integers >= -1 (-1: the embedding output)"),
                 ("sliding_window", self.sliding_window is None or integer(self.sliding_window),
                  "an integer or null"),
                 ("rope_theta", _positive_real(self.rope_theta), "a positive number"),
                 ("rms_norm_eps", _positive_real(self.rms_norm_eps), "a positive number"),
                 ("sliding_causal", isinstance(self.sliding_causal, bool), "true or false"),
                 ("attention_bias", isinstance(self.attention_bias, bool), "true or false"),
                 ("hidden_act", self.hidden_act in ACTIVATIONS, f"one of {list(ACTIVATIONS)}"),
                 ("layer_types", all(t in LAYER_TYPES for t in self.layer_types)
                  and len(self.layer_types) in (0, self.num_layers),
                  f"one of {list(LAYER_TYPES)} per layer ({self.num_layers}), or []"),
                 ("confidence_with_markov", isinstance(self.confidence_with_markov, bool),
                  "true or false"),
                 ("confidence_head", isinstance(self.confidence_head, bool), "true or false"),
                 ("confidence_temperatures", self.confidence_temperatures is None
                  or (self.confidence_head and len(self.confidence_temperatures) == self.k
                      and all(map(_positive_real, self.confidence_temperatures))),
                  "null, or k positive numbers with a confidence head"),
                 ("fused_markov_step", _switch(self.fused_markov_step), "true, false or auto"),
                 ("certified_markov_walk", isinstance(self.certified_markov_walk, bool),
                  "true or false"),
                 ("fused_attention", _switch(self.fused_attention), "true, false or auto"),
                 ("skinny_gemm", _switch(self.skinny_gemm), "true, false or auto")]
        for name, ok, allowed in types:
            if not ok:
                raise ConfigError(f"lane {self.name!r}: {name}={getattr(self, name)!r}, "
                                  f"expected {allowed}")
        checks = [
            (self.dtype in DTYPES, "dtype", f"one of {sorted(DTYPES)}", self.dtype),
            (self.num_heads % self.num_kv_heads == 0, "num_heads",
             f"a multiple of num_kv_heads={self.num_kv_heads}", self.num_heads),
            (1 <= self.draft_vocab_size <= self.target_vocab_size, "draft_vocab_size",
             f"[1, target_vocab_size={self.target_vocab_size}]", self.draft_vocab_size),
            (0 <= self.mask_token_id < self.target_vocab_size, "mask_token_id",
             f"[0, {self.target_vocab_size})", self.mask_token_id),
            (len(self.target_layer_ids) >= 1, "target_layer_ids", "at least one layer",
             self.target_layer_ids),
            ((self.sliding_window is not None) == self.has_sliding_layers, "sliding_window",
             ">= 1 exactly when layer_types marks a layer sliding_attention",
             self.sliding_window),
            (self.sliding_window is None or self.sliding_window >= 1, "sliding_window",
             ">= 1 or null", self.sliding_window),
            (not (self.confidence_head and self.confidence_with_markov)
             or self.markov_rank > 0, "confidence_with_markov",
             "false when markov_rank=0 (the feature is the Markov head's W1 row)",
             self.confidence_with_markov),
            (self.fused_markov_step is not True or self.supports("fused_markov_step"),
             "fused_markov_step", ("false or auto unless markov_head=vanilla, dtype=bfloat16 "
                                   "and markov_rank is a power of two in [16, 1024]"),
             self.fused_markov_step),
            (self.fused_attention is not True or self.supports("fused_attention"),
             "fused_attention",
             "false or auto with dtype=float64 (the kernel has no float64 path)",
             self.fused_attention),
            (self.skinny_gemm is not True or self.supports("skinny_gemm"), "skinny_gemm",
             "false or auto unless dtype is bfloat16 or float16 (the kernel's tensor cores)",
             self.skinny_gemm),
        ]
        for ok, name, allowed, value in checks:
            if not ok:
                raise ConfigError(f"lane {self.name!r}: {name}={value!r}, expected {allowed}")
        try:
            check_rope_scaling(self.rope_scaling)
        except ConfigError as err:
            raise ConfigError(f"lane {self.name!r}: {err}") from None
        if self.rope_scaling and self.rope_scaling["rope_type"] == "dynamic":
            longest = self.rope_scaling["original_max_position_embeddings"]
            if self.max_context + self.block_rows > longest:
                raise ConfigError(
                    f"lane {self.name!r}: max_context={self.max_context}: a dynamic RoPE "
                    f"keeps its frequencies only up to {longest} positions (the model's "
                    "max_position_embeddings) and rescales them all past it, which a fixed "
                    f"table cannot; expected max_context <= {longest - self.block_rows}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def supports(self, path: str, dtype: Optional[str] = None) -> bool:
        """Whether fast path ``path``'s kernel takes this lane in ``dtype`` (default its
        own): the fused Markov walk a vanilla head of a power-of-two rank in bf16, the
        attention kernel any dtype but float64, the skinny GEMM 16-bit dtypes."""
        dtype = dtype or self.dtype
        walkable = self.markov_head is MarkovHead.vanilla and self.markov_rank in (
            16, 32, 64, 128, 256, 512, 1024)
        return {"fused_markov_step": walkable and dtype == "bfloat16",
                "fused_attention": dtype != "float64",
                "skinny_gemm": dtype in ("bfloat16", "float16")}[path]

    def for_device(self, device: torch.device | str, dtype: Optional[str] = None
                   ) -> "LaneConfig":
        """The lane on ``device`` in ``dtype`` (default its own), its fast paths decided: the
        one place they are. ``auto`` is on on CUDA where the kernel takes the lane, ``true``
        on where it takes it (a copy in another dtype, onnx's fp32, drops what it cannot
        run), anything else off."""
        dtype, cuda = dtype or self.dtype, torch.device(device).type == "cuda"
        asked = {path: getattr(self, path) for path in FAST_PATHS}
        decided = {path: (value is True or (value == "auto" and cuda))
                   and self.supports(path, dtype) for path, value in asked.items()}
        return self.replace(dtype=dtype, **decided)

    @property
    def has_sliding_layers(self) -> bool:
        return "sliding_attention" in self.layer_types

    def layer_type(self, layer: int) -> str:
        return self.layer_types[layer] if self.layer_types else "full_attention"

    @property
    def has_d2t(self) -> bool:
        return self.draft_vocab_size < self.target_vocab_size

    @property
    def block_rows(self) -> int:
        """Rows the backbone runs per round: k, or k+1 in the 1+k layout."""
        return self.k + (self.layout is Layout.one_plus_k)

    @property
    def feature_size(self) -> int:
        """Width of one context feature row: the tapped target layers concatenated."""
        return len(self.target_layer_ids) * self.hidden_size

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def replace(self, **changes: Any) -> "LaneConfig":
        return dataclasses.replace(self, **changes)


# per type: required parameters, optional parameters
SCALING_TYPES: dict[str, tuple[set[str], set[str]]] = {
    "linear": ({"factor"}, set()),
    # the default frequencies up to original_max_position_embeddings (LaneConfig checks
    # that the context stays within them); transformers rescales them all past it
    "dynamic": ({"factor", "original_max_position_embeddings"}, set()),
    "llama3": ({"factor", "low_freq_factor", "high_freq_factor",
                "original_max_position_embeddings"}, set()),
    "yarn": ({"factor", "original_max_position_embeddings"},
             {"attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
              "truncate"}),
}


def check_rope_scaling(scaling: Optional[dict[str, Any]]) -> None:
    """Raise :class:`ConfigError` unless ``scaling`` is one the draft step can run."""
    if scaling is None:
        return
    kind = scaling.get("rope_type")
    if kind not in SCALING_TYPES:
        raise ConfigError(f"rope_scaling.rope_type={kind!r}; supported: null (plain RoPE), "
                          f"{sorted(SCALING_TYPES)} (longrope changes with the sequence "
                          "length, which a fixed table cannot)")
    required, optional = SCALING_TYPES[kind]
    missing = sorted(required - set(scaling))
    unknown = sorted(set(scaling) - required - optional - {"rope_type"})
    if missing or unknown:
        raise ConfigError(f"rope_scaling ({kind}): missing {missing}, unknown {unknown}; "
                          f"{kind} takes {sorted(required | optional)}")
    for name, value in scaling.items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if name == "truncate":
            if not isinstance(value, bool):
                raise ConfigError(f"rope_scaling.truncate={value!r}, expected true or false")
        elif name != "rope_type" and not (value is None or number):
            raise ConfigError(f"rope_scaling.{name}={value!r}, expected a number")
    if not scaling["factor"] or scaling["factor"] <= 0:
        raise ConfigError(f"rope_scaling.factor={scaling['factor']!r}, expected a positive "
                          "number")


def _switch(value: Any) -> bool:
    return isinstance(value, bool) or value == "auto"


def _positive_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1e30


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def lane_config(name: str, **overrides: Any) -> LaneConfig:
    """The lane ``conf/lane/<name>.yaml`` as a :class:`LaneConfig`, without Hydra."""
    # imported here: a process that only loads an artifact never reads a lane's YAML
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    path = CONF_DIR / "lane" / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in (CONF_DIR / "lane").glob("*.yaml"))
        raise ConfigError(f"unknown lane {name!r}; known lanes: {known}")
    try:
        node = OmegaConf.merge(OmegaConf.structured(LaneConfig), OmegaConf.load(path),
                               overrides)
    except OmegaConfBaseException as err:
        raise ConfigError(f"lane {name!r}: {err.msg if hasattr(err, 'msg') else err}") from None
    return OmegaConf.to_object(node)


def check_device(device: torch.device | str) -> torch.device:
    """``device`` as a torch device this process can run on, else :class:`ConfigError`."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        parsed = None
    if parsed is None or parsed.type not in ("cpu", "cuda"):
        raise ConfigError(f"device={device!r}; allowed: cpu, cuda, cuda:<index>")
    if parsed.type == "cuda" and not torch.cuda.is_available():
        why = "is a CPU-only build" if torch.version.cuda is None else "sees no GPU"
        raise ConfigError(f"device={device!r}: this torch ({torch.__version__}) {why}; "
                          "allowed here: cpu")
    return parsed
