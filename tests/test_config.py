import shutil

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException, ValidationError

from dspark_compile.tools.commands import Config, register_configs
from dspark_compile.config import CONF_DIR, LaneConfig, lane_config
from dspark_compile.errors import ConfigError

LANES = sorted(path.stem for path in (CONF_DIR / "lane").glob("*.yaml"))


def test_the_lanes_are_the_ones_the_readme_lists():
    assert LANES == ["qwen36_27b", "qwen36_35b_a3b", "smollm2_135m", "tiny", "tiny_d2t"]


def compose_config(*overrides, conf_dir=CONF_DIR):
    register_configs()
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_default_is_the_tiny_lane_on_the_cpu():
    config = OmegaConf.to_object(compose_config())
    assert isinstance(config, Config)
    assert config.lane.name == "tiny" and config.device == "cpu"
    assert config.backend.name == "inductor" and config.buckets == [1, 4]


@pytest.mark.parametrize("name", LANES)
def test_every_lane_composes_into_the_schema(name):
    lane = OmegaConf.to_object(compose_config(f"lane={name}")).lane
    assert isinstance(lane, LaneConfig) and lane.name == name
    assert lane == lane_config(name)


def test_unknown_key_in_an_override_fails_at_compose_time_naming_it():
    with pytest.raises(ConfigCompositionException) as info:
        compose_config("lane.hiden_size=3")
    assert isinstance(info.value.__cause__, OmegaConfBaseException)
    assert "Key 'hiden_size' not in 'LaneConfig'" in str(info.value.__cause__)


def test_unknown_key_in_a_lane_file_fails_at_compose_time_naming_it(tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    (conf / "lane" / "typo.yaml").write_text(
        (CONF_DIR / "lane" / "tiny.yaml").read_text() + "hiden_size: 3\n")
    with pytest.raises(ConfigCompositionException, match="Key 'hiden_size' not in 'LaneConfig'"):
        compose_config("lane=typo", conf_dir=conf)


def test_wrong_type_fails_at_compose_time_naming_it():
    with pytest.raises(ConfigCompositionException) as info:
        compose_config("lane.k=five")
    assert isinstance(info.value.__cause__, ValidationError)
    assert "lane.k" in str(info.value.__cause__)


def test_bad_enum_value_fails_at_compose_time():
    with pytest.raises(ConfigCompositionException) as info:
        compose_config("lane.markov_head=lstm")
    assert "vanilla" in str(info.value.__cause__)  # lists the allowed heads


def test_unknown_lane_is_refused():
    with pytest.raises(ConfigCompositionException, match="lane"):
        compose_config("lane=nope")
    with pytest.raises(ConfigError, match="known lanes"):
        lane_config("nope")


@pytest.mark.parametrize("changes,field", [
    ({"num_heads": 3}, "num_heads"),
    ({"draft_vocab_size": 1000}, "draft_vocab_size"),
    ({"mask_token_id": 512}, "mask_token_id"),
    ({"dtype": "int8"}, "dtype"),
])
def test_contradictory_lane_fields_raise_config_error(changes, field):
    with pytest.raises(ConfigError, match=field):
        lane_config("tiny", **changes)


def test_the_fast_paths_are_on_by_default_where_they_apply():
    def paths(lane):
        return lane.fused_markov_step, lane.fused_attention, lane.skinny_gemm

    lane = lane_config("qwen36_27b")
    assert paths(lane) == ("auto", "auto", "auto")
    assert paths(lane.for_device("cuda")) == (True, True, True)
    assert paths(lane.for_device("cpu")) == (False, False, False)
    assert paths(lane_config("tiny", markov_head="gated").for_device("cuda")) == (
        False, True, True)
    assert paths(lane_config("tiny", dtype="float32").for_device("cuda")) == (
        False, True, False)
    assert paths(lane_config("tiny", dtype="float64").for_device("cuda")) == (
        False, False, False)
    off = lane_config("tiny", fused_markov_step=False, fused_attention=False, skinny_gemm=False)
    assert paths(off.for_device("cuda")) == (False, False, False)
    # a copy in another dtype (onnx's fp32) drops the paths whose kernels do not take it,
    # asked for or not; the bf16 walk, the 16-bit GEMM and the attention's non-float64 path
    asked = lane_config("tiny", dtype="bfloat16", fused_markov_step=True, fused_attention=True,
                        skinny_gemm=True)
    assert paths(asked.for_device("cpu")) == (True, True, True)  # asked for: kept
    assert paths(asked.for_device("cuda", "float32")) == (False, True, False)
    assert paths(asked.for_device("cuda", "float16")) == (False, True, True)
    assert paths(asked.for_device("cuda", "float64")) == (False, False, False)
    assert asked.for_device("cuda", "float32").dtype == "float32"


def test_a_lane_from_a_manifest_takes_only_a_bool_certified_walk():
    lane = lane_config("tiny")
    with pytest.raises(ConfigError, match="certified_markov_walk='yes', expected true or false"):
        lane.replace(certified_markov_walk="yes")


def test_asking_for_a_fast_path_where_it_does_not_apply_is_an_error():
    with pytest.raises(ConfigError, match="fused_markov_step=True"):
        lane_config("tiny", markov_head="rnn", fused_markov_step=True)
    with pytest.raises(ConfigError, match="true, false or auto"):
        lane_config("tiny", fused_attention="sometimes")
    with pytest.raises(ConfigError, match="skinny_gemm=True"):
        lane_config("tiny", dtype="float32", skinny_gemm=True)
