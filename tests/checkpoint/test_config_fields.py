"""docs/config_fields.md lists every field the formats' own config classes carry, and a
field it calls ignored changes nothing that is loaded."""

import json
import re
import shutil
from pathlib import Path

import pytest
from transformers import LlamaConfig, Qwen3Config

from dspark_compile.checkpoint import load_checkpoint
from dspark_compile.config import lane_config

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "config_fields.md"
CHECKPOINTS = Path(__file__).parent
LAYERS, DEEPSPEC, SPECULATORS = "The layer config", "DeepSpec's own", "speculators' own"


def documented() -> dict[str, dict[str, str]]:
    """section title start -> {field: how}, from the page's tables."""
    sections, current = {}, None
    for line in PAGE.read_text().splitlines():
        if line.startswith("## "):
            current = sections.setdefault(line[3:], {})
        elif current is not None and (row := re.match(r"\| `([^`]+)` \| (\w+) \|", line)):
            current[row[1]] = row[2]
    return {start: next(fields for title, fields in sections.items() if title.startswith(start))
            for start in (LAYERS, DEEPSPEC, SPECULATORS)}


def deepspec_written() -> set[str]:
    """Every key DeepSpec's own code wrote into the fixtures' config.json files."""
    return {key for path in CHECKPOINTS.glob("deepspec_*/**/config.json")
            for key in json.loads(path.read_text())}


def test_every_field_of_the_formats_config_classes_is_on_the_page():
    page = documented()
    layers = set(Qwen3Config().to_dict()) | set(LlamaConfig().to_dict())
    missing = {LAYERS: layers - set(page[LAYERS]),
               DEEPSPEC: deepspec_written() - layers - set(page[DEEPSPEC])}
    speculators = pytest.importorskip("speculators.models.dspark",
                                      reason="pip install --no-deps speculators==0.9.0")
    missing[SPECULATORS] = set(speculators.DSparkSpeculatorConfig().to_dict()) - set(
        page[SPECULATORS])
    assert not any(missing.values()), missing
    assert all(how in ("read", "ignored") for fields in page.values() for how in fields.values())


# junk for each ignored layer-config field DeepSpec's fixture carries
JUNK = {"mlp_bias": True, "tie_word_embeddings": True, "architectures": ["Other"],
        "attention_dropout": 0.5, "initializer_range": 9.0, "use_cache": False,
        "dtype": "float16", "bos_token_id": 7, "eos_token_id": 8, "pad_token_id": 9,
        "transformers_version": "0", "num_anchors": 1, "num_target_layers": 99,
        "pretraining_tp": 4, "_name_or_path": "x", "output_attentions": True,
        "output_hidden_states": True, "return_dict": False, "chunk_size_feed_forward": 3,
        "is_encoder_decoder": True, "problem_type": "x", "id2label": {"0": "a"},
        "label2id": {"a": 0}}


def test_an_ignored_field_changes_nothing_that_is_loaded(tmp_path):
    ignored = {field for section in (LAYERS, DEEPSPEC)
               for field, how in documented()[section].items() if how == "ignored"}
    assert ignored <= set(JUNK), ignored - set(JUNK)
    source = CHECKPOINTS / "deepspec_tiny" / "checkpoint"
    lane = lane_config("tiny", dtype="float32")
    before = load_checkpoint(source, lane, "cpu")
    shutil.copytree(source, tmp_path, dirs_exist_ok=True)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **JUNK}))
    after = load_checkpoint(tmp_path, lane, "cpu")
    assert after.lane.replace(name=before.lane.name) == before.lane
    assert all(after.state_dict()[k].equal(v) for k, v in before.state_dict().items())
