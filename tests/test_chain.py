"""The chain runner on a toy compendium: skip when unchanged, re-run from a deleted or corrupted artifact, stop on failure."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from triage_cf.core import sha256_file

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
    (root / "nbs" / "9_toy" / "stages").mkdir(parents=True)
    (root / "params").mkdir()
    shutil.copy(REPO / "settings.ini", root / "settings.ini")
    (root / "params" / "profiles.yaml").write_text("smoke: {seed: 42}\n")
    (root / "params" / "toy.yaml").write_text("common: {n: 3, fail_at: none}\n")
    stages = {
        "a_first": [("code", PARAMS + "n = 1", ["parameters"]),
                    ("code", "from triage_cf.chain import stage_setup\npaths = stage_setup('a_first', dataset, profile, run_dir, seed)"),
                    ("code", "(paths.tables / 'a.csv').write_text('x\\n' + '\\n'.join(str(i) for i in range(n)) + '\\n')")],
        "b_second": [("code", PARAMS, ["parameters"]),
                     ("code", "from triage_cf.chain import stage_setup\npaths = stage_setup('b_second', dataset, profile, run_dir, seed)"),
                     ("code", "rows = (paths.tables / 'a.csv').read_text().split()\n(paths.tables / 'b.csv').write_text(f'n\\n{len(rows) - 1}\\n')")],
        "c_third": [("code", PARAMS + "fail_at = 'none'", ["parameters"]),
                    ("code", "from triage_cf.chain import stage_setup\npaths = stage_setup('c_third', dataset, profile, run_dir, seed)"),
                    ("code", "if fail_at == 'c_third':\n    raise ValueError('planted failure in c')\n(paths.figures / 'c.txt').write_text((paths.tables / 'b.csv').read_text())")],
    }
    for name, cells in stages.items():
        nbformat.write(_nb(cells), root / "nbs" / "9_toy" / "stages" / f"{name}.ipynb")
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
    from triage_cf.chain import stage_setup
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


CHUNKED = [("code", PARAMS, ["parameters"]),
           ("code", "from triage_cf.chain import stage_setup\nfrom triage_cf.core import write_json\nimport json, os\n"
                    "paths = stage_setup('d_chunked', dataset, profile, run_dir, seed)"),
           # a durable chunk, reused when present (as fine-tuning checkpoints and prediction chunks are)
           ("code", "chunk = paths.data / 'chunks' / 'part-0.json'\n"
                    "if chunk.exists():\n    part = json.loads(chunk.read_text())\n"
                    "else:\n    part = {'rows': 3}\n    write_json(chunk, part)\n"
                    "if os.environ.get('TOY_CRASH'):\n    raise RuntimeError('planted crash after the chunk')\n"
                    "(paths.tables / 'd.csv').write_text(f\"rows\\n{part['rows']}\\n\")")]


def test_durable_chunks_interrupted_and_corrupted(toy, monkeypatch):
    """A stage interrupted after writing a durable chunk resumes from it and records it among its outputs; a corrupted
    chunk of a finished stage is moved to data/_quarantine/ before the stage re-runs, so the stage recomputes it."""
    from triage_cf.chain import StageFailed, reproduce
    root, _ = toy
    nbformat.write(_nb(CHUNKED), root / "nbs" / "9_toy" / "stages" / "d_chunked.ipynb")
    out = root / "runs" / "toy" / "smoke"
    chunk, rel = out / "data" / "chunks" / "part-0.json", "data/chunks/part-0.json"
    monkeypatch.setenv("TOY_CRASH", "1")
    with pytest.raises(StageFailed, match="planted crash"):
        reproduce("toy", "smoke", stages=["d_chunked"], quiet=True)
    first = json.loads((out / "run.json").read_text())["stages"]["d_chunked"]
    assert first["status"] == "failed" and chunk.exists()
    before = (chunk.stat().st_ino, chunk.stat().st_mtime_ns)
    monkeypatch.delenv("TOY_CRASH")
    assert _statuses(reproduce("toy", "smoke", stages=["d_chunked"], quiet=True)) == ["ran"]
    rec = json.loads((out / "run.json").read_text())["stages"]["d_chunked"]
    assert (chunk.stat().st_ino, chunk.stat().st_mtime_ns) == before           # reused, not recomputed
    assert rec["resumed_from"] == first["started"] and rel in rec["outputs"]    # and recorded: its corruption is detected
    chunk.write_text('{"rows": ')                                               # truncated
    assert _statuses(reproduce("toy", "smoke", stages=["d_chunked"], quiet=True)) == ["ran"]
    rec = json.loads((out / "run.json").read_text())["stages"]["d_chunked"]
    assert rec["quarantined"] == [rel] and (out / "data" / "_quarantine" / rel).read_text() == '{"rows": '
    assert json.loads(chunk.read_text()) == {"rows": 3} and (out / "tables" / "d.csv").read_text() == "rows\n3\n"
    assert "resumed_from" not in rec and rec["outputs"][rel] == sha256_file(chunk)
    assert not any("_quarantine" in k for k in rec["outputs"])


@pytest.mark.skipif(os.name != "posix", reason="IPC sockets are a POSIX transport; elsewhere the kernels use TCP")
def test_stage_kernels_side_by_side_get_their_own_ipc_sockets(tmp_path):
    """Stage kernels started at the same moment, as two chains side by side start them, talk over IPC sockets with
    their own names, not over free TCP ports that two kernels can both pick (the race killed a kernel before it
    replied to kernel_info, tests/test_crash_resume.py's reference run once); their socket files are removed."""
    from jupyter_core.paths import jupyter_runtime_dir
    nb = tmp_path / "k.ipynb"
    nbformat.write(_nb([("code", "import json\nfrom ipykernel import get_connection_info\n"
                                 "c = json.loads(get_connection_info())\nprint(c['transport'], c['ip'])")]), nb)
    code = ("import sys\nfrom pathlib import Path\nfrom triage_cf.chain import execute_stage\n"
            "execute_stage(Path(sys.argv[1]), Path(sys.argv[2]), {}, progress=False)")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(nb), str(tmp_path / f"out{i}.ipynb")], cwd=tmp_path,
                              stderr=subprocess.PIPE, text=True) for i in range(3)]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errs
    seen = [nbformat.read(tmp_path / f"out{i}.ipynb", 4).cells[0].outputs[0]["text"].split() for i in range(3)]
    assert [t for t, _ in seen] == ["ipc"] * 3
    ips = [ip for _, ip in seen]
    assert len(set(ips)) == 3 and all(Path(ip).parent == Path(jupyter_runtime_dir()) for ip in ips), ips
    assert not [f for ip in ips for f in Path(ip).parent.glob(Path(ip).name + "-*")]   # sockets cleaned up
    assert not list(tmp_path.glob("kernel-ipc*"))   # nothing in the kernels' working folder


def test_a_run_folder_of_layout_1_is_migrated_to_the_new_stage_names(tmp_path):
    """A run folder written before nbs/ moved into part folders keeps its records under the stages' new names (run.json,
    executed notebooks, pages, recorded outputs); one that holds both names of a stage is refused; old stage names in a
    profile or `until` fail with the new name."""
    from triage_cf.chain import RENAMED_STAGES, RUN_LAYOUT, migrate_run_folder, stages_for
    from triage_cf.core import RunPaths
    paths = RunPaths(tmp_path / "run").make()
    for stage in ("02_cohort", "04_emulator", "09_report"):
        (paths.notebooks / f"{stage}.ipynb").write_text("{}")
        (paths.html / f"{stage}.html").write_text("<html>")
    run = {"stages": {"02_cohort": {"status": "ok", "outputs": {"data/cohort.parquet": "a"}},
                      "04_emulator": {"status": "ok", "outputs": {"data/models/ft/emulator.json": "b", "notebooks/04_emulator.ipynb": "c"}},
                      "09_report": {"status": "failed", "outputs": {"html/09_report.html": "d"}}}}
    assert migrate_run_folder(paths, run) == ["04_emulator", "09_report"]
    assert list(run["stages"]) == ["02_cohort", "05_emulator", "15_report"] and run["layout"] == RUN_LAYOUT
    assert run["stages"]["05_emulator"]["outputs"] == {"data/models/ft/emulator.json": "b", "notebooks/05_emulator.ipynb": "c"}
    assert run["stages"]["15_report"]["outputs"] == {"html/15_report.html": "d"}
    assert run["migrated"] == {"from_layout": 1, "renamed": {"04_emulator": "05_emulator", "09_report": "15_report"}}
    assert sorted(p.name for p in paths.notebooks.iterdir()) == ["02_cohort.ipynb", "05_emulator.ipynb", "15_report.ipynb"]
    assert sorted(p.name for p in paths.html.iterdir()) == ["02_cohort.html", "05_emulator.html", "15_report.html"]
    assert migrate_run_folder(paths, run) == []                     # layout 2: nothing to do
    assert migrate_run_folder(paths, {"layout": 1, "stages": {}}) == []
    with pytest.raises(RuntimeError, match="holds stage '04_emulator' and its new name '05_emulator'"):
        migrate_run_folder(paths, {"stages": {"04_emulator": {}, "05_emulator": {}}})
    assert set(RENAMED_STAGES.values()).isdisjoint(RENAMED_STAGES)
    with pytest.raises(ValueError, match=r"'04_emulator' is now '05_emulator'"):
        stages_for({"profile": "mine", "stages": ["01_data", "04_emulator"]})


def test_reproduce_migrates_an_old_run_folder(toy):
    "The chain migrates a layout-1 run.json before it runs (the toy's stages keep their names: nothing renamed, layout set)."
    from triage_cf.chain import RUN_LAYOUT, reproduce
    root, stages = toy
    out = root / "runs" / "toy" / "smoke"
    out.mkdir(parents=True)
    (out / "run.json").write_text(json.dumps({"stages": {}}))
    reproduce("toy", "smoke", quiet=True, stages=stages)
    assert json.loads((out / "run.json").read_text())["layout"] == RUN_LAYOUT
