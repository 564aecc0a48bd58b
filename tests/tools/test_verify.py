import json

from dspark_compile.compile.store import MANIFEST
from dspark_compile.runtime import Runner
from dspark_compile.tools.verify import verify_artifact


def test_verify_reports_the_first_mismatch(built_artifact, device, monkeypatch):
    draft = Runner.draft

    def off_by_one_at_step_2(self, inputs, slots):
        out = draft(self, inputs, slots)
        out.ids[:, 2] += 1
        return out
    monkeypatch.setattr(Runner, "draft", off_by_one_at_step_2)
    report = verify_artifact(built_artifact("eager", "tiny"), device.type)
    assert report["identical"] is False
    mismatch = report["first_mismatch"]
    assert (mismatch["round"], mismatch["row"], mismatch["step"]) == (0, 0, 2)
    assert mismatch["id"] == mismatch["host_id"] + 1


def test_verify_cli_exits_nonzero_on_a_refused_artifact(built_artifact, fresh_verify,
                                                        tmp_path):
    import shutil
    damaged = tmp_path / "damaged"
    shutil.copytree(built_artifact("eager", "tiny"), damaged)
    manifest = json.loads((damaged / MANIFEST).read_text())
    manifest["buckets"] = [3, 8]
    (damaged / MANIFEST).write_text(json.dumps(manifest))
    code, report, stderr = fresh_verify(damaged)
    assert code == 2 and report["identical"] is False
    assert "does not match its key" in report["error"] and "does not match its key" in stderr
