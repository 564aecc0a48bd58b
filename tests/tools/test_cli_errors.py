"""Every failure a user can cause on the command line ends with one line naming the field
or the cause and what is allowed, status 2 (130 for an interrupt), and no traceback."""

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

CHECKPOINT = Path(__file__).parents[1] / "checkpoint" / "deepspec_tiny" / "checkpoint"

CASES = {
    "a misspelt key": (["lanee=tiny"], "dspark-compile: ConfigError: lanee: no such field; "
                       "allowed: lane, backend, device,"),
    "a misspelt lane field": (["lane.kk=3"], "lane.kk: no such field; allowed: name, "),
    "an unknown lane": (["lane=tinyy"], "lane=tinyy: no such lane; allowed: qwen36_27b, "
                        "qwen36_35b_a3b, smollm2_135m, tiny, tiny_d2t"),
    "an unknown backend": (["backend=foo"], "backend=foo: no such backend; allowed: aoti, "
                           "eager, inductor, onnx, tensorrt"),
    "a value of the wrong type": (["lane.k=abc"], "lane.k: Value 'abc' of type 'str' could "
                                  "not be converted to Integer"),
    "a bucket out of range": (["buckets=[0]"], "buckets=[0]; allowed: one or more batch "
                              "sizes in [1, lane.max_batch=8]"),
    "verify without its artifact": (["verify"], "dspark-verify: ConfigError: artifact: "
                                    "required; pass artifact=<value>"),
    "bench with an unknown backend": (["bench", "backends=[foo]"], "dspark-bench: "
                                      "ConfigError: backends=['foo']; allowed: names from"),
}


def run(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "dspark_compile", *args],
                          capture_output=True, text=True, timeout=600, **kwargs)


@pytest.mark.parametrize("case", CASES)
def test_a_mistake_ends_in_one_line_and_status_2(tmp_path, case):
    args, expected = CASES[case]
    result = run(*args, f"artifacts_dir={tmp_path}" if args[0] != "verify" else "seed=0")
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and expected in result.stderr, result.stderr
    assert not list(tmp_path.iterdir())


def test_a_wrong_checkpoint_field_names_the_file_once_and_the_key(tmp_path):
    shutil.copytree(CHECKPOINT, tmp_path / "mine")
    config = json.loads((tmp_path / "mine" / "config.json").read_text())
    (tmp_path / "mine" / "config.json").write_text(json.dumps({**config,
                                                               "hidden_size": "thirty-two"}))
    result = run(f"checkpoint={tmp_path / 'mine'}", f"artifacts_dir={tmp_path / 'a'}")
    assert result.returncode == 2
    assert result.stderr == (f"dspark-compile: CheckpointError: {tmp_path / 'mine'}/config.json"
                             ": config.json hidden_size='thirty-two', expected an integer "
                             ">= 1\n")


def test_an_interrupted_build_says_so_and_leaves_nothing(tmp_path):
    """Ctrl-C once the build has started (its first phase on stderr): status 130, one
    line, no artifact folder, no temporary and no lock file."""
    process = subprocess.Popen([sys.executable, "-m", "dspark_compile", "backend=inductor",
                                f"artifacts_dir={tmp_path}"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    lines = []
    for line in process.stderr:  # waits on the build's own progress, not on a clock
        lines.append(line)
        if "tracing, lowering and compiling" in line:
            process.send_signal(signal.SIGINT)
            break
    rest = process.stderr.read()
    assert process.wait(timeout=300) == 130
    assert rest.strip().splitlines()[-1] == "dspark-compile: interrupted"
    assert "Traceback" not in rest
    assert [p.name for p in tmp_path.rglob("*")] == [".locks"]
