"""The chain runner on a toy compendium: skip when unchanged, re-run from a deleted or corrupted artifact, stop on failure."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]


def _nb(cells):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    for kind, src, *tags in cells:
        c = nbformat.v4.new_code_cell(src) if kind == "code" else nbformat.v4.new_markdown_cell(src)
        if tags:
            c.metadata["tags"] = tags[0]
        nb.cells.append(c)
    return nb


PARAMS = 'dataset = "toy"\nprofile = "smoke"\nrun_dir = None\nseed = 42\n'


@pytest.fixture()
def toy(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    (root / "nbs").mkdir(parents=True)
    (root / "params").mkdir()
    shutil.copy(REPO / "settings.ini", root / "settings.ini")
    (root / "params" / "profiles.yaml").write_text("smoke: {seed: 42}\n")
    (root / "params" / "toy.yaml").write_text("common: {n: 3, fail_at: none}\n")
    stages = {
        "a_first": [("code", PARAMS + "n = 1", ["parameters"]),
                    ("code", "from triage_cf.core import stage_setup\npaths = stage_setup('a_first', dataset, profile, run_dir, seed)"),
                    ("code", "(paths.tables / 'a.csv').write_text('x\\n' + '\\n'.join(str(i) for i in range(n)) + '\\n')")],
        "b_second": [("code", PARAMS, ["parameters"]),
                     ("code", "from triage_cf.core import stage_setup\npaths = stage_setup('b_second', dataset, profile, run_dir, seed)"),
                     ("code", "rows = (paths.tables / 'a.csv').read_text().split()\n(paths.tables / 'b.csv').write_text(f'n\\n{len(rows) - 1}\\n')")],
        "c_third": [("code", PARAMS + "fail_at = 'none'", ["parameters"]),
                    ("code", "from triage_cf.core import stage_setup\npaths = stage_setup('c_third', dataset, profile, run_dir, seed)"),
                    ("code", "if fail_at == 'c_third':\n    raise ValueError('planted failure in c')\n(paths.figures / 'c.txt').write_text((paths.tables / 'b.csv').read_text())")],
    }
    for name, cells in stages.items():
        nbformat.write(_nb(cells), root / "nbs" / f"{name}.ipynb")
    monkeypatch.setenv("TRIAGE_CF_ROOT", str(root))
    return root, list(stages)


def _statuses(results):
    return [r.status for r in results]


def test_skip_rerun_and_corruption(toy):
    from triage_cf.chain import reproduce
    root, stages = toy
    out = root / "runs" / "toy" / "smoke"
    assert _statuses(reproduce("toy", "smoke", stages=stages, quiet=True)) == ["ran", "ran", "ran"]
    assert (out / "tables" / "b.csv").read_text() == "n\n3\n"
    run = json.loads((out / "run.json").read_text())
    assert all(run["stages"][s]["status"] == "ok" for s in stages)
    assert run["parameters"]["n"] == 3 and "tables/a.csv" in run["stages"]["a_first"]["outputs"]
    assert (out / "html" / "a_first.html").exists() and (out / "notebooks" / "c_third.ipynb").exists()
    # unchanged: every stage skipped
    assert _statuses(reproduce("toy", "smoke", stages=stages, quiet=True)) == ["skipped"] * 3
    # a deleted artifact: that stage and the ones after it re-run
    (out / "tables" / "b.csv").unlink()
    assert _statuses(reproduce("toy", "smoke", stages=stages, quiet=True)) == ["skipped", "ran", "ran"]
    # a corrupted (truncated) artifact is detected through its sha256 and recomputed, never read
    (out / "tables" / "a.csv").write_text("x\n")
    assert _statuses(reproduce("toy", "smoke", stages=stages, quiet=True)) == ["ran", "ran", "ran"]
    assert (out / "tables" / "b.csv").read_text() == "n\n3\n"
    # a changed parameter re-runs the stages that declare it and everything after
    (root / "params" / "toy.yaml").write_text("common: {n: 5, fail_at: none}\n")
    assert _statuses(reproduce("toy", "smoke", stages=stages, quiet=True)) == ["ran", "ran", "ran"]
    assert (out / "tables" / "b.csv").read_text() == "n\n5\n"
    # --force re-runs everything
    assert _statuses(reproduce("toy", "smoke", stages=stages, quiet=True, force=True)) == ["ran", "ran", "ran"]


def test_failed_stage_stops_chain_and_is_recorded(toy):
    from triage_cf.chain import StageFailed, reproduce
    root, stages = toy
    (root / "params" / "toy.yaml").write_text("common: {n: 3, fail_at: c_third}\n")
    out = root / "runs" / "toy" / "smoke"
    with pytest.raises(StageFailed, match=r"stage c_third failed in cell \[\d+\]: ValueError: planted failure in c"):
        reproduce("toy", "smoke", stages=stages, quiet=True)
    run = json.loads((out / "run.json").read_text())
    assert run["stages"]["c_third"]["status"] == "failed"
    assert "planted failure" in run["stages"]["c_third"]["error"]
    assert run["stages"]["b_second"]["status"] == "ok" and (out / "tables" / "b.csv").exists()  # earlier artifacts intact
    assert (out / "html" / "c_third.html").exists()  # the failed notebook is rendered for inspection
    # after the fix, only the failed stage runs
    (root / "params" / "toy.yaml").write_text("common: {n: 3, fail_at: none}\n")
    assert _statuses(reproduce("toy", "smoke", stages=stages, quiet=True)) == ["skipped", "skipped", "ran"]


def test_notebook_run_by_hand_builds_its_inputs(toy):
    "Outside the chain, stage_setup first brings the earlier stages up to date (what nbdev_test and JupyterLab do)."
    from triage_cf.core import stage_setup
    root, stages = toy
    import triage_cf.chain as chain
    old = chain.STAGES
    chain.STAGES = stages
    try:
        paths = stage_setup("c_third", "toy", "smoke")
    finally:
        chain.STAGES = old
    assert (paths.tables / "b.csv").read_text() == "n\n3\n"
    run = json.loads(paths.run_json.read_text())
    assert set(run["stages"]) == {"a_first", "b_second"}


def test_cli_reports_failure(toy):
    root, stages = toy
    (root / "params" / "toy.yaml").write_text("common: {n: 3, fail_at: c_third}\n")
    code = ("import sys, triage_cf.chain as c; c.STAGES = %r; from triage_cf.cli import main; sys.exit(main(sys.argv[1:]))" % stages)
    p = subprocess.run([sys.executable, "-c", code, "reproduce", "--dataset", "toy", "--profile", "smoke"],
                       capture_output=True, text=True, env={**os.environ, "TRIAGE_CF_ROOT": str(root)})
    assert p.returncode == 1
    assert "stage c_third failed" in p.stderr and "planted failure in c" in p.stderr
    assert "a_first" in p.stdout and "ran" in p.stdout
