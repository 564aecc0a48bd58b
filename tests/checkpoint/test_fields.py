"""The defaults a config.json may leave out are transformers' own Qwen3Config defaults."""

import pytest
from transformers import Qwen3Config

from dspark_compile.checkpoint.fields import QWEN3_DEFAULTS


@pytest.mark.parametrize("key", sorted(QWEN3_DEFAULTS))
def test_our_qwen3_defaults_are_transformers(key):
    config = Qwen3Config(use_sliding_window=True)  # else sliding_window reads None
    if key == "rope_theta":
        assert config.rope_parameters["rope_theta"] == QWEN3_DEFAULTS[key]
    elif key == "use_sliding_window":
        assert Qwen3Config().use_sliding_window == QWEN3_DEFAULTS[key]
    else:
        assert getattr(config, key) == QWEN3_DEFAULTS[key]
