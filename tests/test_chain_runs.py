"""`benchmarks/chain_runs.py`: a run folder's decisions counted as a results record (fit models' primary and
secondary findings), and a clear error for a folder that is not a finished audit run. Hand-made tables."""
import importlib.util
import json
import sys

import pandas as pd
import pytest

from triage_cf.core import repo_root


@pytest.fixture(scope="module")
def cr():
    spec = importlib.util.spec_from_file_location("chain_runs_under_test", repo_root() / "benchmarks" / "chain_runs.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _run(tmp_path, name="synth-en-s7"):
    run = tmp_path / name
    (run / "tables").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps(dict(dataset="synth-en", profile="default", git=dict(commit="abc"),
                                                  parameters=dict(seed=7, synth=dict(n_records=12000)))))
    pd.DataFrame(dict(model=["RF", "MLP"], kappa_w=[0.55, 0.35], n_test=[100, 100],
                      fit_for_audit=[True, False])).to_csv(run / "tables" / "fitness.csv", index=False)
    row = lambda m, c, metric, check, finding: dict(model=m, condition=c, metric=metric, check=check, estimate=0.01,
                                                     effect=0.02, p=0.01 if finding else 0.5, p_method="predictive t, 8 df",
                                                     mde=0.07, finding=finding)
    pd.DataFrame([row("RF", "full", "female_skew", "primary", False), row("RF", "full", "PDR", "secondary", True),
                  row("RF", "tab_iso", "NMDF", "secondary", False), row("MLP", "full", "female_skew", "primary", True),
                  row("MLP", "full", "PDR", "secondary", True)]).to_csv(run / "tables" / "null_test.csv", index=False)
    return run


def test_run_record_counts_fit_models_only(cr, tmp_path):
    r = cr.run_record(_run(tmp_path))
    assert (r["seed"], r["commit"], r["synth"]) == (7, "abc", dict(n_records=12000))
    by = {m["model"]: m for m in r["models"]}
    assert by["RF"]["secondary_which"] == ["full/PDR"] and by["MLP"]["primary_finding"]
    # the MLP is unfit: its findings are not findings of the audit
    assert (r["fit_primary_findings"], r["fit_secondary_findings"]) == (0, 1)


def test_record_replaces_a_run_and_refuses_an_unfinished_one(cr, tmp_path):
    out = tmp_path / "chain_runs.json"
    cr.record([_run(tmp_path)], "first", out)
    got = cr.record([_run(tmp_path / "again")], "second", out)
    assert [r["note"] for r in got["runs"]] == ["second"]          # same name and seed: replaced, not duplicated
    (tmp_path / "bare").mkdir()
    with pytest.raises(FileNotFoundError, match="missing .*fitness.csv"):
        cr.run_record(tmp_path / "bare")
