"""The commands' configs are checked whole at compose time, and a typed error ends a
command with status 2 and one line."""

import os
import subprocess
import sys

import pytest
import torch
from hydra import compose, initialize_config_dir

from dspark_compile.tools.commands import register_configs, to_config
from dspark_compile.config import CONF_DIR, check_device, lane_config
from dspark_compile.errors import ConfigError
from dspark_compile.runtime import load_runner

NO_CUDA = "this machine has CUDA: device=cuda is valid here"


def composed(config_name, *overrides):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides))


@pytest.mark.parametrize("config_name,extra", [("config", []), ("bench", []),
                                               ("verify", ["artifact=x"])])
def test_fields_a_plus_adds_are_refused_by_every_command(config_name, extra):
    typo = "+lane.markov_hed=gated" if config_name != "verify" else "+contxt=3"
    with pytest.raises(ConfigError, match=r"unknown fields \[.*(markov_hed|contxt).*frobnicate"):
        to_config(composed(config_name, *extra, typo, "+frobnicate=3"))


def test_the_python_api_refuses_an_unknown_lane_field_with_a_config_error():
    with pytest.raises(ConfigError, match="markov_hed"):
        lane_config("tiny", markov_hed="gated")


@pytest.mark.parametrize("override,match", [
    ("device=gpu", "device='gpu'; allowed: cpu, cuda"),
    ("batch=-1", r"batch=-1; allowed: \[1, the largest bucket 4\]"),
    ("batch=5", "batch=5"),
    ("buckets=[0,4]", r"buckets=\[0, 4\]"),
    ("buckets=[16]", r"lane.max_batch=8"),
    ("rounds=0", "rounds=0"),
    ("verifier=/somewhere", "only with checkpoint="),
])
def test_bad_values_are_refused_when_the_config_is_composed(override, match):
    with pytest.raises(ConfigError, match=match):
        to_config(composed("config", override))


def test_bench_names_an_unknown_backend():
    with pytest.raises(ConfigError, match=r"backends=\['eager', 'bogus'\]"):
        to_config(composed("bench", "backends=[eager,bogus]"))


@pytest.mark.skipif(torch.cuda.is_available(), reason=NO_CUDA)
def test_cuda_on_a_torch_without_it_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="CPU-only build|sees no GPU"):
        check_device("cuda")
    with pytest.raises(ConfigError, match="device='cuda'"):
        load_runner(tmp_path, "cuda")  # refused before the artifact is even looked at


def run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "dspark_compile", *args],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("name,args", [
    ("dspark-compile", ["checkpoint=/no/such/dir"]),
    ("dspark-compile", ["+lane.markov_hed=gated"]),
    ("dspark-bench", ["bench", "backends=[bogus]"]),
])
def test_a_typed_error_is_one_line_and_status_2(name, args):
    result = run(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{name}: "), result.stderr


@pytest.mark.parametrize("flag,env", [("--debug", {}), (None, {"DSPARK_DEBUG": "1"})])
def test_debug_shows_the_traceback(flag, env):
    debug = run("checkpoint=/no/such/dir", *[flag] * (flag is not None), env=env)
    assert debug.returncode != 0 and "Traceback" in debug.stderr
    assert "CheckpointError" in debug.stderr


def test_verify_prints_one_json_line_when_it_cannot_check(tmp_path):
    result = run("verify", f"artifact={tmp_path}")
    assert result.returncode == 2
    assert result.stdout.strip().splitlines() == [
        '{"identical": false, "error": "ArtifactError: ' + str(tmp_path) + ': no manifest.json:'
        ' not an artifact, or a half-written one (builds become visible only when complete)"}']
