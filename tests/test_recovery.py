"""Planted-bias recovery study (stage 10_recovery): the library functions at tiny sizes.

The grid, the checks and the power-aware recovery classes on constructed metric tables, the planted truth's structure,
the ideal learner's standard error against a numerical derivative of the oracle, one tiny end-to-end grid with resume and
determinism, the MLP emulator beside the tiny Llama (its own pairs, the shared embedding cache, the LLM's results kept),
and the calibration profile's parameters against the notebook's parameters cell."""
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from triage_cf.audit import recovery as R
from triage_cf.core import load_params, repo_root, sha256_file
from triage_cf.data import load_manifest
from triage_cf.audit.metrics import METRICS, point_metrics

VIEWS = ("full", "text_iso", "tab_iso")


def test_condition_grid():
    g = R.condition_grid(0.009, 0.009, scales=(0, 1, 2), knobs=("both", "tab", "text"), seed=42, null_seeds=4)
    assert list(g.columns) == R.GRID_COLUMNS
    assert g["condition"].tolist() == ["none"] * 4 + ["both_x1", "tab_x1", "text_x1", "both_x2", "tab_x2", "text_x2"]
    assert g.loc[g.condition == "none", "seed"].tolist() == [42, 43, 44, 45]
    assert (g.loc[g.condition != "none", "seed"] == 42).all()
    t = g.set_index("condition")
    assert t.loc["tab_x2", "bias_tab"] == pytest.approx(0.018) and t.loc["tab_x2", "bias_text"] == 0
    assert t.loc["text_x1", "bias_tab"] == 0 and t.loc["text_x1", "bias_text"] == pytest.approx(0.009)
    assert (t.loc["none", ["bias_tab", "bias_text"]].to_numpy() == 0).all()
    cal = R.condition_grid(0.009, 0.009, scales=(0, 1, 2, 5, 10), seed=42, null_seeds=4)
    assert len(cal) == 4 + 4 * 3 and cal.set_index("condition").loc["both_x5", "bias_text"] == pytest.approx(0.045)
    with pytest.raises(ValueError, match="must be > 0"):
        R.condition_grid(0.0, 0.01)
    with pytest.raises(ValueError, match="positive integer"):
        R.condition_grid(0.01, 0.01, null_seeds=0)
    with pytest.raises(ValueError, match=">= 0"):
        R.condition_grid(0.01, 0.01, scales=(-1, 1))


def _row(view, metric, est, lo, hi, truth, bt=0.01, bx=0.0):
    return dict(view=view, metric=metric, estimate=est, ci_low=lo, ci_high=hi, truth=truth, bias_tab=bt, bias_text=bx)


def test_add_checks_constructed():
    t = pd.DataFrame([
        _row("tab_iso", "female_skew", 0.03, 0.01, 0.05, 0.02),      # moves the right way: ok
        _row("tab_iso", "NATS_up", -0.02, -0.03, -0.01, -0.01),       # negative truth, CI below 0: ok
        _row("tab_iso", "NMDF", -0.03, -0.05, -0.01, 0.02),           # wrong sign: not ok
        _row("tab_iso", "DTS_M_to_F", 0.01, -0.01, 0.03, 0.02),       # right point sign, CI covers 0: not ok
        _row("text_iso", "female_skew", 0.0, -0.01, 0.01, 0.0),       # no knob acts on text_iso: stays at 0, ok
        _row("text_iso", "NMDF", 0.02, 0.01, 0.03, 0.0),              # ... but it moved: attribution fails
        _row("full", "PDR", 0.1, 0.05, 0.15, 0.02),                   # rates carry no sign check
        _row("full", "female_skew", np.nan, np.nan, np.nan, 0.02),    # undefined metric: no verdict
    ])
    c = R.add_checks(t)
    nb = lambda s: [None if pd.isna(v) else bool(v) for v in s]
    assert c["expected_move"].tolist() == [True, True, True, True, False, False, True, True]
    assert nb(c["covers_zero"]) == [False, False, False, True, True, False, False, None]
    assert nb(c["sign_ok"]) == [True, True, False, False, None, None, None, None]
    assert nb(c["attributed_ok"]) == [True, True, False, False, True, False, None, None]


def test_coverage_and_summary_constructed():
    rows = []
    for seed, spurious in ((1, False), (2, True), (3, False)):
        for model in ("FT", "oracle"):
            for view in VIEWS:
                for metric in R.COVERAGE_METRICS:
                    est = 0.04 if (spurious and model == "FT" and view == "text_iso") else 0.0
                    rows.append(dict(condition="none", knob="none", scale=0.0, seed=seed, model=model,
                                     **_row(view, metric, est, est - 0.02, est + 0.02, 0.0, 0.0, 0.0)))
    for model, est in (("FT", -0.05), ("oracle", 0.05)):   # text knob: FT gets the sign wrong
        for view in VIEWS:
            for metric in R.COVERAGE_METRICS:
                moves = view != "tab_iso"
                e = est if moves else 0.0
                rows.append(dict(condition="text_x1", knob="text", scale=1.0, seed=1, model=model,
                                 **_row(view, metric, e, e - 0.02, e + 0.02, 0.03 if moves else 0.0, 0.0, 0.01)))
    t = R.add_checks(pd.DataFrame(rows))
    cov = R.coverage_table(t).set_index(["model", "view", "metric"])
    assert cov.loc[("FT", "text_iso", "female_skew"), ["n_seeds", "n_covering"]].tolist() == [3, 2]
    assert cov.loc[("FT", "text_iso", "female_skew"), "coverage"] == pytest.approx(2 / 3)
    assert (cov.xs("oracle")["coverage"] == 1).all() and cov.loc[("FT", "full", "NMDF"), "coverage"] == 1
    s = R.recovery_summary(t).set_index(["condition", "seed", "model", "metric"])
    ft, orc = s.loc[("text_x1", 1, "FT", "female_skew")], s.loc[("text_x1", 1, "oracle", "female_skew")]
    assert ft["expected_full_text_tab"] == "+ / + / 0" and ft["moved_full_text_tab"] == "- / - / 0" and not ft["sign_ok"] and not ft["attributed_ok"]
    assert orc["moved_full_text_tab"] == "+ / + / 0" and orc["sign_ok"] and orc["attributed_ok"]
    assert not s.loc[("none", 2, "FT", "NMDF"), "attributed_ok"] and s.loc[("none", 1, "FT", "NMDF"), "attributed_ok"]


def test_recovery_class_every_class_and_boundary():
    rc = R.recovery_class
    # (model CI, truth, oracle CI) -> class
    cases = [
        ((0.01, 0.05), 0.02, (0.005, 0.04), "recovered"),
        ((-0.05, -0.01), -0.02, (-0.04, -0.005), "recovered"),       # negative truth, CI below 0
        ((0.001, 0.05), 0.02, (-0.01, 0.04), "recovered"),           # a detection counts even where the oracle sees nothing
        ((-0.05, -0.001), 0.02, (0.005, 0.04), "wrong"),
        ((0.001, 0.05), -0.02, (-0.04, -0.005), "wrong"),
        ((0.0, 0.05), 0.02, (0.005, 0.04), "missed"),                 # a CI touching 0 covers it
        ((-0.05, 0.0), -0.02, (-0.04, -0.005), "missed"),
        ((-0.01, 0.05), 0.02, (0.0, 0.04), "not_powered"),            # the oracle's CI touching 0 is no detection
        ((-0.01, 0.05), 0.02, (-0.01, 0.04), "not_powered"),
        ((-0.01, 0.05), 0.02, (np.nan, np.nan), "not_powered"),       # the oracle's metric undefined on these pairs
        ((0.0, 0.0), 0.0, (0.0, 0.0), "quiet"),
        ((-0.02, 0.0), 0.0, (np.nan, np.nan), "quiet"),
        ((0.0001, 0.02), 0.0, (0.0, 0.0), "false_positive"),
        ((-0.02, -0.0001), 0.0, (0.0, 0.0), "false_positive"),
        ((np.nan, np.nan), 0.02, (0.005, 0.04), "undefined"),
        ((0.01, 0.05), np.nan, (0.005, 0.04), "undefined"),
    ]
    for (lo, hi), truth, (olo, ohi), want in cases:
        assert rc(lo, hi, truth, olo, ohi) == want, (lo, hi, truth, olo, ohi)
    assert set(w for *_, w in cases) == set(R.RECOVERY_CLASSES)
    with pytest.raises(ValueError, match="ci_low"):
        rc(0.05, 0.01, 0.02, 0.0, 0.1)


def _classable(rows):
    "Constructed rows (model, emulator, view, metric, ci_low, ci_high, truth) of one planted tab_x1 condition, checked."
    t = pd.DataFrame([dict(condition="tab_x1", knob="tab", scale=1.0, seed=42, dataset="toy", emulator=e, model=m,
                           n_pairs=np_, **_row(v, met, (lo + hi) / 2, lo, hi, tr))
                      for m, e, np_, v, met, lo, hi, tr in rows])
    return R.add_checks(t)


def test_classify_recovery_uses_each_emulators_own_oracle():
    rows = [  # the FT and MLP rows of tab_iso female_skew have the same CI; the oracles on their pairs differ
        ("FT", "tiny-llama", 2000, "tab_iso", "female_skew", -0.01, 0.03, 0.02),
        ("oracle", "tiny-llama", 2000, "tab_iso", "female_skew", 0.005, 0.03, 0.02),
        ("MLP", "mlp", 400, "tab_iso", "female_skew", -0.01, 0.03, 0.02),
        ("oracle", "mlp", 400, "tab_iso", "female_skew", -0.01, 0.05, 0.02),
        ("FT", "tiny-llama", 2000, "text_iso", "female_skew", 0.001, 0.02, 0.0),     # nothing planted on text_iso
        ("oracle", "tiny-llama", 2000, "text_iso", "female_skew", 0.0, 0.0, 0.0),
        ("MLP", "mlp", 400, "text_iso", "female_skew", -0.01, 0.02, 0.0),
        ("oracle", "mlp", 400, "text_iso", "female_skew", 0.0, 0.0, 0.0),
        ("FT", "tiny-llama", 2000, "full", "PDR", 0.1, 0.2, 0.05),                   # a rate: no class
        ("oracle", "tiny-llama", 2000, "full", "PDR", 0.01, 0.05, 0.05),
        ("MLP", "mlp", 400, "full", "NMDF", -0.05, -0.01, 0.02),                     # wrong sign
        ("oracle", "mlp", 400, "full", "NMDF", 0.01, 0.03, 0.02),
    ]
    c = R.classify_recovery(_classable(rows))
    got = [None if pd.isna(v) else v for v in c["recovery_class"]]
    assert got == ["missed", "recovered", "not_powered", "not_powered", "false_positive", "quiet", "quiet", "quiet",
                   None, None, "wrong", "recovered"]
    assert [None if pd.isna(v) else bool(v) for v in c["oracle_detects"]] == [True, True, False, False, False, False, False,
                                                                              False, None, None, True, True]
    with pytest.raises(ValueError, match="no oracle row"):
        R.classify_recovery(_classable(rows[:1]))
    with pytest.raises(ValueError, match="duplicated oracle"):
        R.classify_recovery(_classable(rows[:2] + rows[1:2]))
    with pytest.raises(KeyError, match="emulator"):
        R.classify_recovery(_classable(rows).drop(columns="emulator"))


def test_recovery_classes_counts_per_emulator_knob_and_scale():
    rows = []
    for scale, ft_lo in ((1.0, -0.01), (5.0, 0.01)):     # FT misses at scale 1 (the oracle detects), recovers at 5
        for view, tr in (("full", 0.02), ("tab_iso", 0.02), ("text_iso", 0.0)):
            for metric in R.COVERAGE_METRICS:
                rows += [("FT", "tiny-llama", 1500 + int(scale), view, metric, ft_lo if tr else -0.01, 0.03, tr),
                         ("oracle", "tiny-llama", 1500 + int(scale), view, metric, 0.005 if tr else 0.0, 0.03 if tr else 0.0, tr)]
    parts = []
    for scale in (1.0, 5.0):
        sub = [r for r in rows if r[2] == 1500 + int(scale)]
        parts.append(_classable(sub).assign(scale=scale, condition=f"tab_x{scale:g}"))
    k = R.recovery_classes(R.classify_recovery(pd.concat(parts, ignore_index=True)))
    assert list(k.columns) == R.CLASS_TABLE_KEYS + ["n_conditions", "pairs_min", "pairs_max", "n_checks"] + list(R.RECOVERY_CLASSES)
    k = k.set_index(["model", "scale"])
    assert k.loc[("FT", 1.0), ["n_checks", "recovered", "missed", "wrong", "not_powered", "quiet"]].tolist() == [6, 0, 4, 0, 0, 2]
    assert k.loc[("FT", 5.0), ["recovered", "missed", "quiet", "pairs_min", "pairs_max"]].tolist() == [4, 0, 2, 1505, 1505]
    assert k.loc[("oracle", 1.0), ["recovered", "wrong", "not_powered", "quiet"]].tolist() == [4, 0, 0, 2]
    assert k.index.get_level_values("model").tolist() == ["FT", "FT", "oracle", "oracle"]


@pytest.fixture(scope="module")
def settings():
    man = load_manifest("synth-en")
    return R.RecoverySettings("synth-en", man, synth={"no_cue_share": 0.3}, n_records=300, train_n=30, pairs=10, epochs=1,
                              hidden=16, layers=1, vocab=400)


def test_planted_truth_structure(settings):
    t0 = R.planted_truth(settings, 0.0, 0.0, 600, 11)
    assert set(t0["view"]) == set(VIEWS) and set(t0["metric"]) == set(METRICS) and (t0["truth"] == 0).all()
    tab = R.planted_truth(settings, 0.2, 0.0, 600, 11).set_index(["view", "metric"])["truth"]
    txt = R.planted_truth(settings, 0.0, 0.2, 600, 11).set_index(["view", "metric"])["truth"]
    for t, moving, still in ((tab, "tab_iso", "text_iso"), (txt, "text_iso", "tab_iso")):
        assert (t[still] == 0).all()
        for v in ("full", moving):   # a female-favouring effect: every signed metric has its sign
            assert t[v, "female_skew"] > 0 and t[v, "NMDF"] > 0 and t[v, "DTS_M_to_F"] > 0 and t[v, "DTS_F_to_M"] < 0
            assert t[v, "NATS_up"] < 0 and t[v, "NATS_down"] > 0
            assert t[v, "P_down_M_to_F"] == 0 and t[v, "P_up_F_to_M"] == 0   # the exact oracle never moves against the effect
    # both knobs move the full view at least as much as either alone
    both = R.planted_truth(settings, 0.2, 0.2, 600, 11).set_index(["view", "metric"])["truth"]
    assert both["full", "NMDF"] >= max(tab["full", "NMDF"], txt["full", "NMDF"])


def test_knob_standard_error_matches_numerical_information(settings):
    from triage_cf.synth import oracle_proba
    co = R.condition_cohort(settings, 0.0, 0.0, 5, 400)
    kn = {"no_cue_share": 0.3, "bias_tab": 0.0, "bias_text": 0.0}
    se = R.knob_standard_errors(co, "en", kn, 1000).set_index("knob")
    # per-visit Fisher information of a latent shift, from central differences of the oracle's level probabilities:
    # every visit recorded as female, so that moving bias_tab shifts every latent (at bias 0 the sex does not matter)
    fem, h = co.assign(sex="F"), 1e-4
    p = oracle_proba(fem, "en", **kn)
    d = (oracle_proba(fem, "en", **{**kn, "bias_tab": h}) - oracle_proba(fem, "en", **{**kn, "bias_tab": -h})) / (2 * h)
    with np.errstate(divide="ignore", invalid="ignore"):
        info = np.where(p > 1e-12, d ** 2 / np.where(p > 1e-12, p, 1), 0).sum(1)
    z = (co["sex"] == "F").to_numpy(float)
    zbar = (info * z).sum() / info.sum()
    want = 1 / np.sqrt(1000 * (info * (z - zbar) ** 2).mean())
    assert se.loc["bias_tab", "se"] == pytest.approx(want, rel=1e-4)
    assert se.loc["bias_tab", "share_exposed"] == pytest.approx(z.mean())
    # 1/sqrt(n)
    assert R.knob_standard_errors(co, "en", kn, 4000).set_index("knob").loc["bias_text", "se"] == pytest.approx(se.loc["bias_text", "se"] / 2)


def test_settings_key_identifies_results(settings):
    k = settings.key(0.0, 0.0, 1)
    assert k == R.RecoverySettings(**{**settings.__dict__, "predict_batch_size": 3}).key(0.0, 0.0, 1)
    assert k != R.RecoverySettings(**{**settings.__dict__, "epochs": 2}).key(0.0, 0.0, 1)
    assert k != settings.key(0.0, 0.001, 1) and k != settings.key(0.0, 0.0, 2)
    # the LLM's result key ignores the MLP's settings (adding the MLP keeps the LLM's results), and vice versa
    both = R.RecoverySettings(**{**settings.__dict__, "emulators": ("tiny-llama", "mlp"), "mlp_pairs": 5})
    assert both.key(0.0, 0.0, 1, "tiny-llama") == k and both.key(0.0, 0.0, 1, "mlp") != k
    assert both.key(0.0, 0.0, 1, "mlp") == R.RecoverySettings(**{**both.__dict__, "epochs": 3}).key(0.0, 0.0, 1, "mlp")
    assert both.key(0.0, 0.0, 1, "mlp") != R.RecoverySettings(**{**both.__dict__, "mlp_pairs": 6}).key(0.0, 0.0, 1, "mlp")
    with pytest.raises(ValueError, match="at most one LLM"):
        R.RecoverySettings(**{**settings.__dict__, "emulators": ("tiny-llama", "smollm2")})
    with pytest.raises(ValueError, match="distinct"):
        R.RecoverySettings(**{**settings.__dict__, "emulators": ()})


def test_run_grid_resume_and_determinism(settings, tmp_path):
    grid = R.condition_grid(0.014, 0.014, scales=(0, 20), knobs=("tab",), seed=3, null_seeds=1)
    runs = R.run_grid(grid, settings, tmp_path, log=lambda s: None)
    files = [R.result_path(tmp_path, settings, c) for c in grid.to_dict("records")]
    assert all(f.exists() and f.with_suffix(".json").exists() for f in files)
    assert not any((tmp_path / "work").glob("*"))
    assert runs["n_train"].tolist() == [30, 30] and runs["status"].tolist() == ["ran", "ran"]
    long = R.load_results(grid, settings, tmp_path)
    assert set(long["view"]) == set(VIEWS) and set(long["model"]) == {"FT", "oracle"}
    assert len(long) == 2 * 3 * runs["n_pairs"].sum()
    # oracle with a strong tabular effect: every change in tab_iso favours the female version
    o = long[(long.model == "oracle") & (long.condition == "tab_x20") & (long.view == "tab_iso")]
    fem_minus_male = np.where(o.orig_sex == "M", o.pred_cf - o.pred_orig, o.pred_orig - o.pred_cf)
    assert (fem_minus_male >= 0).all()
    # resume: done conditions are skipped (files untouched) ...
    sha = [sha256_file(f) for f in files]
    mtimes = [f.stat().st_mtime_ns for f in files]
    again = R.run_grid(grid, settings, tmp_path, log=lambda s: None)
    assert [f.stat().st_mtime_ns for f in files] == mtimes
    assert again.drop(columns=["status", "wall_s"]).equals(runs.drop(columns=["status", "wall_s"]))
    # ... and a condition whose result is gone (a run killed before writing it) is recomputed bit for bit
    files[1].unlink()
    logs = []
    R.run_grid(grid, settings, tmp_path, log=logs.append)
    assert logs[0].startswith("1 of 2 condition runs already done") and [f.stat().st_mtime_ns for f in files][0] == mtimes[0]
    assert [sha256_file(f) for f in files] == sha
    # two worker processes give the same results as one (torch runs on `threads` threads inside every condition)
    for f in files:
        f.unlink()
    R.run_grid(grid, settings, tmp_path, workers=2, log=lambda s: None)
    assert [sha256_file(f) for f in files] == sha


def test_mlp_beside_the_llm(settings, tmp_path):
    grid = R.condition_grid(0.014, 0.014, scales=(0, 20), knobs=("tab",), seed=3, null_seeds=1)
    R.run_grid(grid.iloc[:1], settings, tmp_path, log=lambda s: None)              # the LLM alone first
    ft_file = R.result_path(tmp_path, settings, grid.iloc[0])
    mtime = ft_file.stat().st_mtime_ns
    both = R.RecoverySettings(**{**settings.__dict__, "emulators": ("tiny-llama", "mlp"), "mlp_pairs": 6})
    logs = []
    runs = R.run_grid(grid, both, tmp_path, log=logs.append)
    # adding the MLP keeps the LLM's finished result; the LLM's rows run first
    assert logs[0].startswith("1 of 4 condition runs already done") and ft_file.stat().st_mtime_ns == mtime
    assert runs["model"].tolist() == ["FT", "FT", "MLP", "MLP"] and runs["emulator"].tolist()[2:] == ["mlp", "mlp"]
    assert (runs.loc[runs.model == "MLP", "n_pairs"] <= 6).all() and (runs.loc[runs.model == "FT", "n_pairs"] > 6).all()
    assert (runs.loc[runs.model == "MLP", "n_embedded"] > 0).all() and runs.loc[runs.model == "FT", "n_embedded"].isna().all()
    long = R.load_results(grid, both, tmp_path)
    for emu, g in long.groupby("emulator"):   # each emulator's file holds the oracle on exactly its own pairs
        ids = {m: set(zip(d.condition, d.pair_id, d.view)) for m, d in g.groupby("model")}
        assert set(ids) == {R.emulator_model(emu), "oracle"} and ids[R.emulator_model(emu)] == ids["oracle"]
    # a rerun of an MLP condition reads every embedding from the run's shared cache and gives the same file
    f = R.result_path(tmp_path, both, grid.iloc[1], "mlp")
    sha = sha256_file(f)
    f.unlink()
    again = R.run_condition(grid.iloc[1], both, tmp_path, "mlp")
    assert again["n_embedded"] == 0 and sha256_file(f) == sha
    # the stage's tables: classes per emulator, the oracle never wrong
    truth = pd.concat([R.planted_truth(both, r.bias_tab, r.bias_text, 400, 9).assign(bias_tab=r.bias_tab, bias_text=r.bias_text)
                       for r in grid.itertuples()], ignore_index=True)
    table = R.recovery_table(long, grid, truth, "synth-en", n_boot=50)
    assert set(table["model"]) == {"FT", "MLP", "oracle"} and table.loc[table.metric.isin(R.SIGNED_METRICS), "recovery_class"].notna().all()
    k = R.recovery_classes(table)
    assert set(zip(k.emulator, k.model)) == {("tiny-llama", "FT"), ("tiny-llama", "oracle"), ("mlp", "MLP"), ("mlp", "oracle")}
    assert k.loc[k.model == "oracle", "wrong"].sum() == 0
    assert (k.loc[k.knob == "none", ["recovered", "missed", "wrong", "not_powered"]].to_numpy() == 0).all()
    assert (k.loc[k.model == "MLP", "pairs_max"] <= 6).all() and (k["n_checks"] == k[list(R.RECOVERY_CLASSES)].sum(axis=1)).all()


def test_recovery_table_on_constructed_predictions(settings):
    rng = np.random.default_rng(0)
    n = 400
    sex = np.where(np.arange(n) % 2 == 0, "F", "M")
    base = rng.integers(2, 5, n)
    rows = []
    for view in VIEWS:
        for model in ("FT", "oracle"):
            y = base.copy()
            yc = base.copy()
            if view != "text_iso":   # a tabular effect: the female version one level higher in 10% of pairs
                bump = np.arange(n) % 10 == 0
                yc = np.where(bump & (sex == "M"), y + 1, np.where(bump & (sex == "F"), y - 1, y))
            rows.append(pd.DataFrame(dict(pair_id=np.arange(n), orig_sex=sex, pred_orig=y, pred_cf=yc, view=view,
                                          true_level=base, model=model, condition="tab_x1", seed=42, emulator="tiny-llama")))
    long = pd.concat(rows, ignore_index=True)
    grid = R.condition_grid(0.01, 0.01, scales=(1,), knobs=("tab",), seed=42)
    truth = pd.DataFrame([dict(bias_tab=0.01, bias_text=0.0, view=v, metric=m, truth=(0.0 if v == "text_iso" else
                               {"NATS_up": -0.1, "DTS_F_to_M": -0.1, "P_down_M_to_F": 0.0, "P_up_F_to_M": 0.0}.get(m, 0.1)))
                          for v in VIEWS for m in METRICS])
    t = R.recovery_table(long, grid, truth, "synth-en", n_boot=200)
    assert list(t.columns) == R.TABLE_COLUMNS and len(t) == 2 * 3 * len(METRICS)
    for (model, view), g in t.groupby(["model", "view"]):
        sub = long[(long.model == model) & (long.view == view)]
        want = point_metrics(sub.orig_sex, sub.pred_orig, sub.pred_cf)
        got = g.set_index("metric")["estimate"]
        assert all(got[m] == pytest.approx(want[m], abs=1e-12) for m in METRICS)
    fs = t[t.metric == "female_skew"].set_index(["model", "view"])
    assert fs.loc[("FT", "full"), "sign_ok"] and fs.loc[("FT", "tab_iso"), "attributed_ok"]
    assert fs.loc[("FT", "text_iso"), "covers_zero"] and fs.loc[("FT", "text_iso"), "attributed_ok"]
    assert fs.loc[("FT", "full"), "estimate"] == pytest.approx(0.2)   # DTS_M_to_F 0.1 - DTS_F_to_M (-0.1)
    # FT and oracle predict alike: both recover the tabular effect where it is planted, and stay quiet on text_iso
    assert fs.loc[("FT", "full"), "recovery_class"] == "recovered" and fs.loc[("FT", "text_iso"), "recovery_class"] == "quiet"
    assert fs.loc[("oracle", "tab_iso"), "oracle_detects"] and pd.isna(t.loc[t.metric == "PDR", "recovery_class"]).all()
    with pytest.raises(ValueError, match="not in the grid"):
        R.recovery_table(long.assign(condition="both_x9"), grid, truth, "synth-en", n_boot=10)
    with pytest.raises(KeyError, match="emulator"):
        R.recovery_table(long.drop(columns="emulator"), grid, truth, "synth-en", n_boot=10)


def test_calibration_profile_matches_the_notebook():
    import papermill as pm
    declared = set(pm.inspect_notebook(str(repo_root() / "nbs" / "1_audit" / "stages" / "10_recovery.ipynb")).keys())
    for ds in ("synth-fr", "synth-en"):
        p = load_params(ds, "calibration")
        assert p["recovery_study"] is True
        keys = {k for k in p if k.startswith("recovery_") and k != "recovery_study"}
        assert keys <= declared, f"calibration keys the notebook does not declare: {sorted(keys - declared)}"
        assert {0, 1, 2, 5, 10} <= set(p["recovery_scales"])
        assert p["recovery_pairs"] is None      # every pair of the test split
        R.RecoverySettings(ds, load_manifest(ds), emulators=p["recovery_emulators"])   # valid emulators
        assert p["recovery_null_seeds"] >= 3 and set(p["recovery_knobs"]) == {"both", "tab", "text"}
        assert p["synth"]["n_records"] > 0 and p["recovery_n_records"] > 2 * p["recovery_train_n"]
    # the default profile (make reproduce) does not run the study
    assert not load_params("synth-fr", "default").get("recovery_study")


def test_stratified_subsample(settings):
    "The study draws its pairs with the emulator's sampler, stratified by level x sex."
    from triage_cf.audit.emulator import stratified_subsample
    co = R.condition_cohort(settings, 0.0, 0.0, 5, 400)
    sub, how = stratified_subsample(co, 100, ["triage_level", "sex"], 0)
    assert len(sub) == 100 and sub["record_id"].is_monotonic_increasing and sub["record_id"].is_unique
    assert "triage_level x sex" in how and sub.equals(stratified_subsample(co, 100, ["triage_level", "sex"], 0)[0])  # seeded
    share = lambda d: d.groupby(["triage_level", "sex"]).size() / len(d)
    assert (share(sub) - share(co)).abs().max() < 0.02                                   # strata kept
    assert len(stratified_subsample(co, 3, ["triage_level", "sex"], 0)[0]) == 3          # fewer rows than strata
    assert len(stratified_subsample(co, None, ["sex"], 0)[0]) == len(co)
