import json
import subprocess
import sys
from pathlib import Path

import pytest

from dspark_compile.tools.sweep import progress

ROOT = Path(__file__).resolve().parents[2]


def sweep(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from dspark_compile.cli import sweep_main; sweep_main()", "-m",
         "buckets=[1]", "repeats=2", "warmup=1", f"artifacts_dir={tmp_path / 'artifacts'}",
         f"hydra.sweep.dir={tmp_path / 'sweep'}", *overrides],
        capture_output=True, text=True, timeout=900, cwd=tmp_path)


def table(tmp_path: Path) -> list[dict]:
    lines = (tmp_path / "sweep" / "results.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_two_by_two_sweep_fills_one_table_and_plots_it(tmp_path):
    """Both tiny lanes x two contexts, each job in its own process (joblib launcher)."""
    result = sweep(tmp_path, "hydra.sweeper.params.backends='[eager]'", "context=16,24")
    assert result.returncode == 0, result.stderr
    assert "4/4 jobs (0 failed)" in result.stdout.splitlines()[-1]
    rows = table(tmp_path)
    jobs = {(r["lane"], r["context"]) for r in rows}
    assert jobs == {(lane, c) for lane in ("tiny", "tiny_d2t") for c in (16, 24)}
    assert len(rows) == 4 * 3  # host, eager device path, runtime: batch 1 each
    for row in rows:
        assert row["status"] == "ok" and row["identical"] and row["ms"] > 0
        assert row["overrides"]["context"] == str(row["context"])
        assert f"lane={row['lane']}" in row["job"]
    csv_lines = (tmp_path / "sweep" / "results.csv").read_text().splitlines()
    assert csv_lines[0].startswith("job,status,error,lane,context,batch,path,ms")
    assert len(csv_lines) == 1 + len(rows)
    plotted = subprocess.run([sys.executable, str(ROOT / "scripts" / "plot_sweep.py"),
                              str(tmp_path / "sweep" / "results.jsonl")],
                             capture_output=True, text=True, timeout=300)
    assert plotted.returncode == 0, plotted.stderr
    png = Path(plotted.stdout.strip())
    assert png == tmp_path / "sweep" / "sweep.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_failed_job_is_a_row_and_the_sweep_goes_on_with_the_slurm_launcher_locally(
        tmp_path):
    """The SLURM launcher's submitit_local form; one job asks for a backend that does not
    exist."""
    result = sweep(tmp_path, "hydra/launcher=local", "lane=tiny", "context=16",
                   "hydra.sweeper.params.backends='[eager],[nope]'")
    assert result.returncode == 0, result.stderr
    rows = table(tmp_path)
    failed = [r for r in rows if r["status"] == "failed"]
    assert len(failed) == 1 and "backends=['nope']" in failed[0]["error"]
    assert "backends=[nope]" in failed[0]["job"]
    ok = [r for r in rows if r["status"] == "ok"]
    assert [r["path"] for r in ok] == ["host", "device (eager)", "runtime (eager)"]


@pytest.mark.parametrize("done,failed,total,expected", [
    (0, 0, 4, "sweep: [..........] 0/4 jobs (0 failed)"),
    (2, 1, 4, "sweep: [#####.....] 2/4 jobs (1 failed)"),
    (3, 0, None, "sweep: 3 jobs done (0 failed)"),
])
def test_progress_line(done, failed, total, expected):
    assert progress(done, failed, total, width=10) == expected


def test_a_sweep_without_its_launcher_plugins_says_how_to_install_them(tmp_path):
    """Without the ``sweep`` extra nothing provides the ``hydra_plugins`` namespace (hidden
    here from a fresh process): one line that names the install command, no traceback."""
    script = ("import sys; sys.modules['hydra_plugins'] = None\n"
              "from dspark_compile.cli import sweep_main; sweep_main()")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=300, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "dspark-sweep: MissingBackendError: dspark-sweep needs "
        "hydra_plugins.hydra_joblib_launcher: pip install 'dspark-compile[sweep]'"]
