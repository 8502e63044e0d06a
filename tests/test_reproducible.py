"""Results are reproducible bit for bit: two uninterrupted smoke runs of synth-en (same dataset, profile and
seed) in different folders give the same tables and prediction files, byte for byte; run.json holds what is needed to
repeat a run; a corrupted artifact of the real chain is detected by its sha256 and recomputed, never read.
The runs are shared with tests/test_crash_resume.py (tests/_smoke_runs.py)."""
import json
import platform
import re
import shutil
import subprocess
from importlib import metadata

import pytest

import _smoke_runs as sr
from triage_cf.chain import stages_for
from triage_cf.core import load_params, sha256_file

STAGES = stages_for(load_params(sr.DATASET, sr.PROFILE))
PRED = "08_predict"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    for name in ("first", "second"):  # both in the background, at once
        sr.start_uninterrupted(name, tmp_path_factory)
    return [sr.uninterrupted(name, tmp_path_factory) for name in ("first", "second")]


def _run_json(out):
    return json.loads((out / "run.json").read_text())


def test_two_runs_give_identical_tables_and_predictions(runs):
    a, b = runs
    digests = sr.assert_same_artifacts(a, b)
    # what is compared: the paper tables and every prediction file (final and chunks) of the emulator and the oracle
    for rel in ("data/predictions/FT.parquet", "data/predictions/oracle.parquet", "data/predictions/test_FT.parquet"):
        assert rel in digests
    assert sum(k.startswith("data/predictions/FT/") for k in digests) >= 6
    assert sum(k.startswith("tables/") and k.endswith(".csv") for k in digests) >= 8
    # the record-level inputs of those tables are identical too, and so are the fine-tuned weights
    for rel in ("data/records.parquet", "data/cohort.parquet", "data/split.parquet", "data/pairs.parquet"):
        assert sha256_file(a / rel) == sha256_file(b / rel), rel
    assert _run_json(a)["models"] == _run_json(b)["models"]


def test_run_json_holds_what_repeats_the_run(runs):
    out = runs[0]
    run = _run_json(out)
    assert (run["dataset"], run["profile"]) == (sr.DATASET, sr.PROFILE)
    # code: the commit (and whether the working tree differed from it)
    assert re.fullmatch(r"[0-9a-f]{40}", run["git"]["commit"] or ""), run["git"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=sr.REPO, capture_output=True, text=True).stdout.strip()
    assert run["git"]["commit"] == head and isinstance(run["git"]["dirty"], bool)
    # parameters: the merged profile + dataset parameters, seed included
    assert run["parameters"] == json.loads(json.dumps(load_params(sr.DATASET, sr.PROFILE), default=str))
    assert run["parameters"]["seed"] == 42
    # data: the input files' sha256 (none for a synthetic cohort, whose generator seed and knobs are parameters) and
    # the sha256 of the record table the run made
    prov = json.loads((out / "data" / "provenance.json").read_text())
    assert run["data_files"] == prov["files"] == {}
    assert run["stages"]["01_data"]["outputs"]["data/records.parquet"] == sha256_file(out / "data" / "records.parquet")
    # package versions
    assert run["packages"]["python"] == platform.python_version()
    for pkg in ("triage_cf", "torch", "transformers", "numpy", "pandas", "pyarrow", "scikit-learn"):
        assert run["packages"][pkg] == metadata.version(pkg), pkg
    # models: the fine-tuned emulator's weights by sha256 (smoke: a tiny Llama built from a config, no base weights)
    ft = run["models"]["ft"]
    assert ft["kind"] == "full" and ft["ft_model"] == "tiny-llama"
    assert ft["base_model"] is None and ft["base_sha256"] is None
    folder = out / "data" / "models" / "ft" / "model"
    weights = ft["weights_sha256"]
    assert weights and weights == {rel: sha256_file(folder / rel) for rel in weights}
    assert set(weights) == {p.relative_to(folder).as_posix() for p in folder.rglob("*.safetensors")}
    for name, rec in run["models"].items():  # every trained model of the run (e.g. the FS baseline) names its weights
        assert rec["weights_sha256"], name
        for rel, sha in rec["weights_sha256"].items():
            assert any(sha256_file(f) == sha for f in (out / "data" / "models" / name).rglob(rel)), (name, rel)


def test_run_json_records_input_file_sha256(tmp_path):
    "On a dataset with files (the open MIMIC-IV-ED demo), run.json holds the sha256 of every input file."
    from triage_cf.chain import reproduce
    from triage_cf.core import data_root
    from triage_cf.data import file_checksum_status, load_manifest
    m = load_manifest("mimic-iv-ed-demo")
    if any(file_checksum_status(f) == "missing" for f in m["files"]):
        pytest.skip(f"mimic-iv-ed-demo: files absent under the data root {data_root()}; set TRIAGE_CF_DATA")
    out = tmp_path / "run"
    reproduce("mimic-iv-ed-demo", "smoke", out=out, stages=["01_data"], quiet=True, progress=False)
    files = _run_json(out)["data_files"]
    assert len(files) == len(m["files"])
    for f in m["files"]:
        sha = next(v for k, v in files.items() if k.endswith(f["path"]) or f["path"].endswith(k))
        assert sha == sha256_file(data_root() / f["path"]) == f["sha256"]


def test_corrupt_prediction_chunk_is_recomputed_never_read(runs, tmp_path):
    """Truncate one durable prediction chunk of a finished run (a copy), re-run: the chain sees the sha256 mismatch with
    run.json, sets the file aside, and stage 08_predict recomputes that chunk (same bytes as before) and reuses the others."""
    out = tmp_path / "run"
    shutil.copytree(runs[1], out)
    chunks = sorted((out / "data" / "predictions" / "FT").rglob("chunk-*.parquet"))
    bad = chunks[len(chunks) // 2]
    rel = bad.relative_to(out).as_posix()
    good = sha256_file(bad)
    assert _run_json(out)["stages"][PRED]["outputs"][rel] == good
    truncated = bad.read_bytes()[: bad.stat().st_size // 2]
    bad.write_bytes(truncated)
    others = {c: (c.stat().st_ino, c.stat().st_mtime_ns) for c in chunks if c != bad}
    p = sr.wait_chain(sr.start_chain(out, "corrupt"))
    st = sr.stage_statuses(sr.log_text(p))
    i = STAGES.index(PRED)
    assert [st.get(s) for s in STAGES] == ["skipped"] * i + ["ran"] * (len(STAGES) - i), st
    assert f"{rel}: sha256 differs from run.json" in sr.log_text(p)
    run = _run_json(out)
    assert run["stages"][PRED]["quarantined"] == [rel]
    assert (out / "data" / "_quarantine" / rel).read_bytes() == truncated  # set aside, kept for inspection
    assert sha256_file(bad) == good  # recomputed, the same bytes
    assert {c: (c.stat().st_ino, c.stat().st_mtime_ns) for c in others} == others  # the intact chunks were reused
    sr.assert_same_artifacts(out, runs[0])


def test_baselines_score_the_views_the_emulator_scored(runs, tmp_path):
    """04b scores the Table 2 test records in the views that 04 scored them in (`ft_eval_views`, read from
    test_FT.parquet): with the FT's test predictions cut to the full view (the `default` profile's setting), FS, RF and
    MLP write the full view only, the same rows as when all three views were scored, and Table 2 is the same file."""
    import pandas as pd
    from triage_cf.chain import reproduce
    from triage_cf.core import VIEWS, write_parquet
    src, out = runs[0], tmp_path / "run"
    shutil.copytree(src, out)
    pred = out / "data" / "predictions"
    ft = pd.read_parquet(pred / "test_FT.parquet")
    assert set(ft["view"]) == set(VIEWS)
    write_parquet(ft[ft["view"] == "full"].reset_index(drop=True), pred / "test_FT.parquet")
    reproduce(sr.DATASET, sr.PROFILE, out=out, stages=["06_baselines"], force=True, quiet=True)
    for m in ("FS", "RF", "MLP"):
        old, new = pd.read_parquet(src / "data" / "predictions" / f"test_{m}.parquet"), pd.read_parquet(pred / f"test_{m}.parquet")
        assert set(old["view"]) == set(VIEWS) and set(new["view"]) == {"full"}, m
        pd.testing.assert_frame_equal(new, old[old["view"] == "full"].reset_index(drop=True), obj=m)
    table2 = "tables/table2_performance.csv"
    assert sha256_file(out / table2) == sha256_file(src / table2)
