"""Where the bias is, on the real chain's runs (issue 38): a smoke run writes the subgroup, transition and fidelity
tables and its report shows them; `triage-cf compare` puts finished runs side by side and refuses what it cannot
compare. The smoke runs are tests/_smoke_runs.py's (shared with test_reproducible and test_crash_resume)."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import _smoke_runs as sr
from triage_cf.audit.metrics import METRICS
from triage_cf.audit.subgroups import AGE_LABELS, CROSSINGS, FAMILIES


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    for name in ("first", "second"):
        sr.start_uninterrupted(name, tmp_path_factory)
    return [sr.uninterrupted(name, tmp_path_factory) for name in ("first", "second")]


def _cli(*args):
    exe = Path(sys.executable).with_name("triage-cf")
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True)


def test_a_run_writes_where_the_bias_is(runs):
    t = runs[0] / "tables"
    st = pd.read_csv(t / "subgroups.csv")
    assert set(st.family) == set(FAMILIES)
    assert set(st[st.family == "age_band"].subgroup) <= set(AGE_LABELS) | {"age unknown"}
    assert {"chest pain", "abdominal pain"} <= set(st[st.family == "complaint_category"].subgroup)
    assert st.test.notna().all() and (st.test.astype(str) != "").all()        # every value tested or labelled
    tested = st[st.p.notna()]
    assert len(tested) and set(tested.model) <= {"RF", "MLP"}               # the smoke profile tests RF and MLP (K = 4)
    assert (st[st.p.isna()].test.str.contains("too few pairs|untested|reference|undefined")).all()
    tr = pd.read_csv(t / "transitions.csv")
    cross = tr[tr.cell.isin(CROSSINGS)]
    assert len(cross) == tr[["model", "condition"]].drop_duplicates().shape[0] * 4
    n_levels = pd.read_parquet(runs[0] / "data" / "cohort.parquet").triage_level.nunique()   # 4 in the smoke cohort
    assert (tr[~tr.cell.isin(CROSSINGS)].groupby(["model", "condition", "direction"]).size() == n_levels ** 2).all()
    fb = pd.read_csv(t / "fidelity_by_sex.csv")
    k = fb[fb.measure == "kappa_w"]
    assert set(k.group) == {"F", "M", "F_minus_M"} and k.estimate.notna().all()
    html = (runs[0] / "report.html").read_text()
    assert "Where the bias is" in html and "tables/subgroups.csv" in html and "tables/fidelity_by_sex.csv" in html


def test_compare_two_runs(runs, tmp_path):
    res = _cli("compare", *runs, "--out", tmp_path / "cmp")
    assert res.returncode == 0, res.stderr
    long = pd.read_csv(tmp_path / "cmp" / "comparison.csv")
    assert set(long.metric) == set(METRICS) and long.run.nunique() == 2
    a, b = (g.drop(columns="run").reset_index(drop=True) for _, g in long.groupby("run"))
    pd.testing.assert_frame_equal(a, b)                                      # the same run twice: the same numbers
    assert "female_skew" in (tmp_path / "cmp" / "comparison.md").read_text()
    assert (tmp_path / "cmp" / "comparison.png").stat().st_size > 1000


def _copy_run(run: Path, dest: Path, **meta) -> Path:
    "run.json and tables/ of a run (compare reads nothing else) with run.json's fields replaced."
    dest.mkdir(parents=True)
    shutil.copytree(run / "tables", dest / "tables")
    m = json.loads((run / "run.json").read_text())
    (dest / "run.json").write_text(json.dumps({**m, **meta}))
    return dest


def test_compare_refuses_what_it_cannot_compare(runs, tmp_path):
    res = _cli("compare", runs[0], tmp_path / "no_such_run", "--out", tmp_path / "cmp")
    assert res.returncode == 2 and "no_such_run: not a finished audit run folder (no such folder)" in res.stderr
    old = _copy_run(runs[0], tmp_path / "old", layout=1)
    res = _cli("compare", runs[0], old, "--out", tmp_path / "cmp")
    assert res.returncode == 2 and f"{old}: run-folder layout 1" in res.stderr
    other = _copy_run(runs[0], tmp_path / "other")
    t3 = pd.read_csv(other / "tables" / "table3_bias_metrics.csv")
    t3.loc[t3.metric == "NMDF", "metric"] = "NMDF_v0"
    t3.to_csv(other / "tables" / "table3_bias_metrics.csv", index=False)
    res = _cli("compare", runs[0], other, "--out", tmp_path / "cmp")
    assert res.returncode == 2 and "other metric definitions" in res.stderr and str(other) in res.stderr
    res = _cli("compare", runs[0], runs[0], "--out", tmp_path / "cmp")
    assert res.returncode == 2 and "given twice" in res.stderr
    assert not (tmp_path / "cmp").exists()                                   # nothing written for a refused comparison


def test_compare_reads_only_the_rendered_tables(runs, tmp_path):
    "A restricted run's tables are suppressed where it wrote them; compare reads only them and run.json."
    cred = _copy_run(runs[1], tmp_path / "cred", access="credentialed")
    assert not (cred / "data").exists()
    res = _cli("compare", runs[0], cred, "--out", tmp_path / "cmp")
    assert res.returncode == 0, res.stderr
    long = pd.read_csv(tmp_path / "cmp" / "comparison.csv")
    assert set(long.access) == {"open", "credentialed"}
