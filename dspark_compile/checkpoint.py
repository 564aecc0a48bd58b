"""Checkpoints: DeepSpec-native and speculators-format safetensors + config.json, and seeded
random weights for any lane.

Weights are created or loaded straight onto the target device in the lane's dtype (the
27B lane is about 4.4 B parameters: never build it on the CPU first). Nothing is unpickled.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from dspark_compile.config import LaneConfig, Layout
from dspark_compile.errors import CheckpointError
from dspark_compile.model import Drafter
from dspark_compile.model.vocab import random_d2t

WEIGHTS = "model.safetensors"
CONFIG = "config.json"


class Format(str, Enum):
    deepspec = "deepspec"
    speculators = "speculators"


def empty_drafter(lane: LaneConfig, device: torch.device | str) -> Drafter:
    """A drafter with uninitialised storage on ``device``, in the lane's dtype."""
    with torch.device("meta"):
        drafter = Drafter(lane).to(lane.torch_dtype)
    drafter.to_empty(device=device)
    drafter.fill_rope_tables()
    return drafter.eval()


def cast_drafter(drafter: Drafter, dtype: str) -> Drafter:
    """A copy of ``drafter`` in another dtype (its lane says so too)."""
    lane = drafter.lane.replace(dtype=dtype)
    copy = empty_drafter(lane, drafter.fc.weight.device)
    copy.load_state_dict(drafter.state_dict())  # copy_ casts
    return copy


@torch.no_grad()
def random_drafter(lane: LaneConfig, device: torch.device | str = "cpu", seed: int = 0
                   ) -> Drafter:
    """Seeded random weights, drawn on ``device`` (the same seed differs across devices)."""
    drafter = empty_drafter(lane, device)
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in drafter.named_parameters():
        if name.endswith("norm.weight"):
            p.normal_(1.0, 0.1, generator=gen)
        elif p.dim() == 1:  # biases
            p.normal_(0.0, 0.1, generator=gen)
        elif name in ("embed_tokens.weight", "markov_head.markov_w1.weight"):
            p.normal_(0.0, 1.0, generator=gen)
        else:  # unit-variance outputs for unit-variance inputs
            p.normal_(0.0, p.shape[1] ** -0.5, generator=gen)
    if lane.has_d2t:
        drafter.d2t.copy_(random_d2t(lane.draft_vocab_size, lane.target_vocab_size, gen,
                                     drafter.d2t.device))
    return drafter


def checkpoint_config(lane: LaneConfig, fmt: Format) -> dict[str, Any]:
    """The config.json a checkpoint of this lane carries."""
    backbone = {
        "hidden_size": lane.hidden_size,
        "num_hidden_layers": lane.num_layers,
        "num_attention_heads": lane.num_heads,
        "num_key_value_heads": lane.num_kv_heads,
        "head_dim": lane.head_dim,
        "intermediate_size": lane.intermediate_size,
        "vocab_size": lane.target_vocab_size,
        "rms_norm_eps": lane.rms_norm_eps,
        "rope_theta": lane.rope_theta,
        "use_sliding_window": lane.sliding_window is not None,
        "sliding_window": lane.sliding_window,
    }
    heads = {
        "block_size": lane.k,
        "mask_token_id": lane.mask_token_id,
        "markov_rank": lane.markov_rank,
        "markov_head_type": lane.markov_head.value,
        "enable_confidence_head": True,
        "confidence_head_with_markov": lane.confidence_with_markov,
        "sample_from_anchor": lane.layout is Layout.anchor_first,
    }
    if fmt is Format.deepspec:
        if lane.has_d2t:
            raise CheckpointError(f"lane {lane.name!r} has a reduced draft vocabulary "
                                  f"({lane.draft_vocab_size}); only the speculators format "
                                  "stores d2t")
        return {"architectures": ["DSparkDraftModel"], "model_type": "qwen3", **backbone,
                **heads, "target_layer_ids": lane.target_layer_ids,
                "block_causal": lane.block_causal}
    return {"speculators_model_type": "dspark", "architectures": ["DSparkSpeculator"],
            "transformer_layer_config": backbone, **heads,
            "draft_vocab_size": lane.draft_vocab_size,
            # HF hidden_states indices: index 0 is the embeddings, so layer i is i + 1
            "aux_hidden_state_layer_ids": [i + 1 for i in lane.target_layer_ids],
            "sliding_window_non_causal": not lane.block_causal}


def lane_from_config(config: dict[str, Any], lane: LaneConfig) -> LaneConfig:
    """``lane`` with its geometry replaced by what a checkpoint's config.json says."""
    speculators = "speculators_model_type" in config
    backbone = config.get("transformer_layer_config", {}) if speculators else config
    if not isinstance(backbone, dict):
        raise CheckpointError("config.json: transformer_layer_config is not an object")

    def need(source: dict[str, Any], key: str) -> Any:
        if key not in source:
            raise CheckpointError(f"config.json lacks {key!r}")
        return source[key]

    if not config.get("enable_confidence_head", True):
        raise CheckpointError("config.json: enable_confidence_head is false; the draft step "
                              "needs a confidence head")
    if speculators:
        taps = [i - 1 for i in need(config, "aux_hidden_state_layer_ids")]
        draft_vocab = need(config, "draft_vocab_size")
        block_causal = not config.get("sliding_window_non_causal", True)
    else:
        taps = need(config, "target_layer_ids")
        draft_vocab = need(backbone, "vocab_size")
        block_causal = config.get("block_causal", False)
    window = backbone.get("sliding_window") if backbone.get("use_sliding_window") else None
    return lane.replace(
        hidden_size=need(backbone, "hidden_size"),
        num_layers=need(backbone, "num_hidden_layers"),
        num_heads=need(backbone, "num_attention_heads"),
        num_kv_heads=need(backbone, "num_key_value_heads"),
        head_dim=need(backbone, "head_dim"),
        intermediate_size=need(backbone, "intermediate_size"),
        target_vocab_size=need(backbone, "vocab_size"),
        draft_vocab_size=draft_vocab,
        rms_norm_eps=backbone.get("rms_norm_eps", lane.rms_norm_eps),
        rope_theta=backbone.get("rope_theta", lane.rope_theta),
        sliding_window=window,
        k=need(config, "block_size"),
        target_layer_ids=taps,
        mask_token_id=need(config, "mask_token_id"),
        markov_rank=need(config, "markov_rank"),
        markov_head=config.get("markov_head_type", "vanilla"),
        confidence_with_markov=config.get("confidence_head_with_markov", True),
        layout=Layout.anchor_first if config.get("sample_from_anchor", True)
        else Layout.one_plus_k,
        block_causal=block_causal,
    )


def save_checkpoint(drafter: Drafter, directory: str | Path,
                    fmt: Format | str = Format.deepspec) -> Path:
    """Write ``config.json`` and ``model.safetensors`` under ``directory``."""
    fmt, lane = Format(fmt), drafter.lane
    config = checkpoint_config(lane, fmt)
    tensors = {name: t.detach().contiguous().cpu() for name, t in drafter.state_dict().items()}
    if fmt is Format.speculators and lane.has_d2t:
        # t2d marks the target ids the draft vocabulary covers (training only; ignored on load)
        t2d = torch.zeros(lane.target_vocab_size, dtype=torch.bool)
        t2d[torch.arange(lane.draft_vocab_size) + tensors["d2t"]] = True
        tensors["t2d"] = t2d
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, str(directory / WEIGHTS), metadata={"format": "pt"})
    return directory


def load_checkpoint(directory: str | Path, lane: LaneConfig,
                    device: torch.device | str = "cpu") -> Drafter:
    """Load either format onto ``device``. The checkpoint's config.json overrides the lane's
    geometry; every tensor is checked against the resulting shapes before any is loaded."""
    directory = Path(directory)
    try:
        config = json.loads((directory / CONFIG).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{directory / CONFIG}: {err}") from err
    if not isinstance(config, dict):
        raise CheckpointError(f"{directory / CONFIG}: expected a JSON object")
    try:
        lane = lane_from_config(config, lane)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{directory / CONFIG}: {err}") from err
    return load_weights(lane, directory / WEIGHTS, device)


def load_weights(lane: LaneConfig, path: str | Path, device: torch.device | str) -> Drafter:
    """A drafter of ``lane`` with the tensors of one safetensors file, checked key by key."""
    try:
        with torch.device("meta"):  # shapes only: absurd sizes fail here, allocating nothing
            drafter = Drafter(lane).to(lane.torch_dtype)
        expected = {name: tuple(t.shape) for name, t in drafter.state_dict().items()}
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            found = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
            _check_keys(lane, expected, found)
            state = {name: f.get_tensor(name) for name in expected}
    except (OSError, RuntimeError, ValueError, OverflowError, SafetensorError) as err:
        raise CheckpointError(f"{path}: {err}") from err
    state = {name: t if name == "d2t" else t.to(lane.torch_dtype) for name, t in state.items()}
    if lane.has_d2t:
        targets = torch.arange(lane.draft_vocab_size, device=device) + state["d2t"]
        if int(targets.min()) < 0 or int(targets.max()) >= lane.target_vocab_size:
            raise CheckpointError(f"d2t maps draft ids outside [0, {lane.target_vocab_size})")
    drafter.load_state_dict(state, assign=True)
    drafter.fill_rope_tables()
    return drafter.eval()


def _check_keys(lane: LaneConfig, expected: dict[str, tuple[int, ...]],
                found: dict[str, tuple[int, ...]]) -> None:
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected) - {"t2d"})
    if missing or unexpected:
        raise CheckpointError(f"checkpoint keys do not match lane {lane.name!r}: "
                              f"missing {missing}, unexpected {unexpected}")
    for name, shape in expected.items():
        if found[name] != shape:
            raise CheckpointError(f"{name}: checkpoint has shape {list(found[name])}, lane "
                                  f"{lane.name!r} expects {list(shape)}")
