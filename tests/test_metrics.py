"""Bias metrics: point estimates vs an independent implementation, the paper's Table 7, bootstrap CIs,
one-direction pair sets, and the bad-input corpus of `metrics_from_csv`."""
import numpy as np
import pandas as pd
import pytest
from scipy import stats

from triage_cf.audit import metrics as M


# ---------------------------------------------------------------- an independent, straightforward implementation
def reference_metrics(orig_sex, pred_orig, pred_cf):
    """The definitions of notebook 09_metrics written out with plain Python loops over pairs (no shared code with triage_cf)."""
    n = {"M": 0, "F": 0}
    up = {"M": 0, "F": 0}
    down = {"M": 0, "F": 0}
    changed = 0
    female_minus_male = 0
    for s, y, yc in zip(orig_sex, pred_orig, pred_cf):
        y, yc = int(y), int(yc)
        n[s] += 1
        up[s] += yc > y
        down[s] += yc < y
        changed += yc != y
        female, male = (yc, y) if s == "M" else (y, yc)
        female_minus_male += female - male
    N = n["M"] + n["F"]
    nan = float("nan")
    P = {}
    for d, s in (("M_to_F", "M"), ("F_to_M", "F")):
        P[f"P_up_{d}"] = up[s] / n[s] if n[s] else nan
        P[f"P_down_{d}"] = down[s] / n[s] if n[s] else nan
    out = {"PDR": changed / N, **P}
    out["DTS_M_to_F"] = P["P_up_M_to_F"] - P["P_down_M_to_F"]
    out["DTS_F_to_M"] = P["P_up_F_to_M"] - P["P_down_F_to_M"]
    out["NATS_up"] = P["P_up_F_to_M"] - P["P_up_M_to_F"]
    out["NATS_down"] = P["P_down_F_to_M"] - P["P_down_M_to_F"]
    out["NMDF"] = female_minus_male / N
    out["female_skew"] = out["DTS_M_to_F"] - out["DTS_F_to_M"]
    return out


def random_pairs(seed, n, p_male=0.55, levels=5, only=None):
    rng = np.random.default_rng(seed)
    sex = np.where(rng.random(n) < p_male, "M", "F") if only is None else np.full(n, only)
    y = rng.integers(1, levels + 1, n)
    yc = np.clip(y + rng.choice([-2, -1, 0, 0, 0, 0, 1, 2], n) + (rng.random(n) < 0.1) * (sex == "M"), 1, levels)
    return sex, y, yc


def as_pairs(sex, y, yc, condition="full", model=None, true_level=None):
    df = pd.DataFrame({"pair_id": [f"p{i}" for i in range(len(sex))], "orig_sex": sex, "pred_orig": y,
                       "pred_cf": yc, "condition": condition})
    if model is not None:
        df["model"] = model
    if true_level is not None:
        df["true_level"] = true_level
    return df


# ---------------------------------------------------------------- point estimates
@pytest.mark.parametrize("seed,n", [(0, 50), (1, 997), (2, 5000), (3, 3)])
def test_point_estimates_equal_independent_implementation(seed, n):
    sex, y, yc = random_pairs(seed, n)
    ref = reference_metrics(sex, y, yc)
    t = M.table3(as_pairs(sex, y, yc), n_boot=50, seed=seed).set_index("metric")
    for name in M.METRICS:
        r, e = ref[name], t.loc[name, "estimate"]
        assert (np.isnan(r) and np.isnan(e)) or abs(r - e) <= 1e-12, (name, r, e)
        p = M.point_metrics(sex, y, yc)[name]
        assert (np.isnan(r) and np.isnan(p)) or abs(r - p) <= 1e-12, (name, r, p)


def test_several_models_and_conditions_each_match_reference():
    parts, refs = [], {}
    for k, (model, cond) in enumerate([("FT", "full"), ("FT", "text_iso"), ("FS", "full"), ("oracle", "tab_iso")]):
        sex, y, yc = random_pairs(10 + k, 400 + 37 * k)
        df = as_pairs(sex, y, yc, cond, model)
        parts.append(df.assign(pair_id=f"{model}-{cond}-" + df.pair_id))   # different pair sets
        refs[(model, cond)] = reference_metrics(sex, y, yc)
    t = M.table3(pd.concat(parts), n_boot=100, seed=0)
    assert list(t.columns) == M.TABLE3_COLUMNS
    for (model, cond), ref in refs.items():
        sub = t[(t.model == model) & (t.condition == cond)].set_index("metric")
        for name in M.METRICS:
            assert abs(sub.loc[name, "estimate"] - ref[name]) <= 1e-12


# ---------------------------------------------------------------- Appendix C
def test_paper_table7_counts_give_published_or_ci_p():
    counts = pd.DataFrame({"true_level": [3, 4, 5], "cf_lt_orig_M": [530, 712, 194], "cf_ge_orig_M": [15115, 14758, 1335],
                           "cf_lt_orig_F": [769, 646, 72], "cf_ge_orig_F": [13578, 10713, 726]})
    t = M.or_table_from_counts(counts)
    got = [(f"{r.OR:.2f}", f"{r.ci_low:.2f}", f"{r.ci_high:.2f}") for r in t.itertuples()]
    assert got == [("0.62", "0.55", "0.69"), ("0.80", "0.72", "0.89"), ("1.47", "1.10", "1.95")]
    assert f"{t.p_value[2]:.4f}" == "0.0086"
    assert t.p_value[0] < 1e-15


def test_or_zero_cell_is_dash_and_woolf_by_hand():
    assert M.odds_ratio_2x2(0, 7438, 0, 5858)["OR"] == "-"
    a, b, c, d = 20, 80, 10, 90
    r = M.odds_ratio_2x2(a, b, c, d)
    se = np.sqrt(1 / a + 1 / b + 1 / c + 1 / d)
    lor = np.log(a * d / (b * c))
    assert r["OR"] == pytest.approx(a * d / (b * c), rel=1e-12)
    assert (r["ci_low"], r["ci_high"]) == pytest.approx((np.exp(lor - 1.959963984540054 * se), np.exp(lor + 1.959963984540054 * se)), rel=1e-9)
    assert r["p_value"] == pytest.approx(2 * stats.norm.sf(abs(lor) / se), rel=1e-9)


def test_per_level_tables_match_counts():
    sex, y, yc = random_pairs(5, 3000)
    lvl = np.random.default_rng(5).integers(1, 6, 3000)
    pairs = as_pairs(sex, y, yc, true_level=lvl)
    t6 = M.discordance_by_level(pairs)
    t7 = M.or_by_level(pairs)
    for L in range(1, 6):
        for s in "MF":
            m = (lvl == L) & (sex == s)
            r6 = t6[t6.true_level == L].iloc[0]
            assert r6[f"n_{s}"] == m.sum()
            assert r6[f"p_cf_gt_orig_{s}"] == pytest.approx((yc[m] > y[m]).mean(), abs=1e-12)
            assert r6[f"p_cf_lt_orig_{s}"] == pytest.approx((yc[m] < y[m]).mean(), abs=1e-12)
            r7 = t7[t7.true_level == L].iloc[0]
            assert r7[f"cf_lt_orig_{s}"] == (yc[m] < y[m]).sum() and r7[f"cf_ge_orig_{s}"] == (yc[m] >= y[m]).sum()


# ---------------------------------------------------------------- bootstrap
@pytest.mark.parametrize("method", ["percentile", "bca"])
def test_cis_contain_estimate_and_are_reproducible(method):
    sex, y, yc = random_pairs(7, 4000)
    a = M.bootstrap_metrics(sex, y, yc, n_boot=1000, seed=11, ci_method=method)
    assert ((a.ci_low <= a.estimate) & (a.estimate <= a.ci_high)).all()
    assert (a.ci_high > a.ci_low).all()
    pd.testing.assert_frame_equal(a, M.bootstrap_metrics(sex, y, yc, n_boot=1000, seed=11, ci_method=method))
    b = M.bootstrap_metrics(sex, y, yc, n_boot=1000, seed=12, ci_method=method)
    assert not np.allclose(a.ci_low, b.ci_low)


def test_table3_same_seed_same_cis():
    sex, y, yc = random_pairs(8, 2000)
    p = pd.concat([as_pairs(sex, y, yc, "full"), as_pairs(sex, y, y, "tab_iso")])
    pd.testing.assert_frame_equal(M.table3(p, n_boot=200, seed=3), M.table3(p, n_boot=200, seed=3))


def test_multinomial_bootstrap_matches_index_resampling():
    """The category-count bootstrap has the distribution of resampling pair indices: compare CIs from 4,000
    resamples of each (Monte-Carlo tolerance)."""
    sex, y, yc = random_pairs(9, 1500)
    ours = M.bootstrap_metrics(sex, y, yc, n_boot=4000, seed=0).set_index("metric")
    rng = np.random.default_rng(1)
    idx = rng.integers(0, len(sex), size=(4000, len(sex)))
    s, d = (sex == "M")[idx], (yc - y)[idx]
    nM = s.sum(1)
    p_up_mf = ((d > 0) & s).sum(1) / nM
    p_down_fm = ((d < 0) & ~s).sum(1) / (len(sex) - nM)
    nmdf = np.where(s, d, -d).mean(1)
    for name, b in (("P_up_M_to_F", p_up_mf), ("P_down_F_to_M", p_down_fm), ("NMDF", nmdf)):
        lo, hi = np.percentile(b, [2.5, 97.5])
        half = (hi - lo) / 2
        assert abs(ours.loc[name, "ci_low"] - lo) < 0.1 * half and abs(ours.loc[name, "ci_high"] - hi) < 0.1 * half


def test_bca_agrees_with_scipy_on_a_small_sample():
    """A rare event on 400 pairs: the sampling distribution is skewed, BCa moves away from the percentile interval,
    and ours agrees with scipy.stats.bootstrap(method="BCa") up to Monte-Carlo error."""
    rng = np.random.default_rng(2)
    n = 400
    sex = np.where(rng.random(n) < 0.5, "M", "F")
    y = np.full(n, 3)
    yc = y + (rng.random(n) < 0.03)
    is_m, d = sex == "M", yc - y

    def p_up_m_to_f(i, axis=-1):
        i = np.asarray(i)
        s, dd = is_m[i], d[i]
        return ((dd > 0) & s).sum(axis) / s.sum(axis)

    ours = M.bootstrap_metrics(sex, y, yc, n_boot=6000, seed=0, ci_method="bca").set_index("metric").loc["P_up_M_to_F"]
    perc = M.bootstrap_metrics(sex, y, yc, n_boot=6000, seed=0).set_index("metric").loc["P_up_M_to_F"]
    lo, hi = stats.bootstrap((np.arange(n),), p_up_m_to_f, n_resamples=6000, method="BCa",
                             random_state=np.random.default_rng(0), vectorized=True).confidence_interval
    half = (hi - lo) / 2
    assert abs(ours.ci_low - lo) < 0.1 * half and abs(ours.ci_high - hi) < 0.1 * half
    assert abs(perc.ci_high - hi) > 0.3 * half   # the test can tell BCa from percentile


def test_pretraining_difference_uses_joint_resamples():
    sex, y, yc = random_pairs(6, 2000)
    _, _, yc2 = random_pairs(16, 2000)
    yc2 = np.clip(yc2, 1, 5)
    p = pd.concat([as_pairs(sex, y, yc, model="FT"), as_pairs(sex, y, yc2, model="FS")])
    c = M.pretraining_comparison(p, n_boot=500, seed=0).set_index(["model", "metric"])
    ref_ft, ref_fs = reference_metrics(sex, y, yc), reference_metrics(sex, y, yc2)
    for k in ("NATS_up", "NATS_down"):
        assert abs(c.loc[("FT", k), "estimate"] - ref_ft[k]) <= 1e-12
        assert abs(c.loc[("FS", k), "estimate"] - ref_fs[k]) <= 1e-12
        assert abs(c.loc[("FT-FS", k), "estimate"] - (ref_ft[k] - ref_fs[k])) <= 1e-12
        assert c.loc[("FT-FS", k), "ci_low"] <= c.loc[("FT-FS", k), "estimate"] <= c.loc[("FT-FS", k), "ci_high"]


def test_impact_arithmetic():
    "A finding of the audit's test is scaled (with the test's CI); the same row without a finding, or untested, is not."
    row = {"model": "FT", "condition": "full", "metric": "female_skew", "estimate": 0.021, "ci_low": 0.015,
           "ci_high": 0.027, "n_pairs": 1, "remark": "", "fit_for_audit": True, "p": 0.001, "finding": True,
           "train_ci_low": 0.012, "train_ci_high": 0.030}
    imp = M.impact_table(pd.DataFrame([row])).set_index("country")
    assert imp.loc["France", "visits_per_year"] == pytest.approx(20.9e6 * 0.5 * 0.021)
    assert imp.loc["United States", "visits_ci_high"] == pytest.approx(155.4e6 * 0.5 * 0.030)
    for other in ({"finding": False, "mde": 0.05}, {"finding": pd.NA, "p": np.nan, "test": M.UNTESTED}):
        assert not M.impact_table(pd.DataFrame([{**row, **other}])).reportable.any()


# ---------------------------------------------------------------- one direction
def test_one_direction_only_is_valid(tmp_path):
    sex, y, yc = random_pairs(3, 500, only="M")
    as_pairs(sex, y, yc).to_csv(tmp_path / "vignettes.csv", index=False)
    out = M.metrics_from_csv(tmp_path / "vignettes.csv", tmp_path / "out", n_boot=200)
    t = pd.read_csv(out["metrics"], keep_default_na=False, na_values=[""]).set_index("metric")
    ref = reference_metrics(sex, y, yc)
    for name in ("PDR", "P_up_M_to_F", "P_down_M_to_F", "DTS_M_to_F", "NMDF"):
        assert abs(t.loc[name, "estimate"] - ref[name]) <= 1e-12
        assert t.loc[name, "ci_low"] <= t.loc[name, "estimate"] <= t.loc[name, "ci_high"]
    for name in ("P_up_F_to_M", "P_down_F_to_M", "DTS_F_to_M", "NATS_up", "NATS_down", "female_skew"):
        assert np.isnan(t.loc[name, "estimate"]) and np.isnan(t.loc[name, "ci_low"])
        assert "no F_to_M pairs" in t.loc[name, "remark"]
    assert set(out) == {"metrics"}


def test_rare_direction_resamples_are_counted_not_dropped_silently():
    sex = np.array(["M"] * 200 + ["F"])
    y = np.full(201, 3)
    yc = np.r_[np.full(150, 3), np.full(50, 4), 2]
    t = M.bootstrap_metrics(sex, y, yc, n_boot=1000, seed=0).set_index("metric")
    assert "resamples had no pair" in t.loc["DTS_F_to_M", "remark"]   # P(no F pair in a resample) ~ e^-1
    assert t.loc["DTS_M_to_F", "remark"] == ""


# ---------------------------------------------------------------- metrics_from_csv: outputs and bad input
def test_metrics_from_csv_writes_tables(tmp_path):
    sex, y, yc = random_pairs(1, 800)
    lvl = np.random.default_rng(1).integers(2, 6, 800)
    as_pairs(sex, y, yc, true_level=lvl, model="m1").to_csv(tmp_path / "p.csv", index=False)
    out = M.metrics_from_csv(tmp_path / "p.csv", tmp_path / "o", n_boot=100, seed=0)
    assert set(out) == {"metrics", "table6", "table7"}
    assert all(p.exists() for p in out.values())
    t = pd.read_csv(out["metrics"])
    assert list(t.columns) == M.TABLE3_COLUMNS and len(t) == len(M.METRICS)
    t7 = pd.read_csv(out["table7"])
    assert t7[M.TABLE7_COUNTS].to_numpy().sum() == 800


GOOD = "pair_id,orig_sex,pred_orig,pred_cf,condition,true_level\n1,M,3,4,full,3\n2,F,2,2,full,2\n3,F,4,3,full,4\n"


@pytest.mark.parametrize("content,needles", [
    ("", ["bad.csv", "empty file"]),
    ("pair_id,orig_sex,pred_orig,pred_cf,condition\n", ["bad.csv", "0 data rows"]),
    ("pair_id,orig_sex,pred_orig,condition\n1,M,3,full\n", ["bad.csv", "1 required column(s) missing", "pred_cf"]),
    ("pair_id,pred_orig,condition\n1,3,full\n", ["bad.csv", "2 required column(s) missing", "orig_sex", "pred_cf"]),
    (GOOD.replace("1,M,3,4", "1,M,3.5,4"), ["bad.csv", "'pred_orig'", "1 value(s) that are not integers", "3.5"]),
    (GOOD.replace("2,F,2,2", "2,F,two,2").replace("3,F,4,3", "3,F,4,"), ["bad.csv", "'pred_orig'", "1 value(s)"]),
    (GOOD.replace("3,F,4,3", "3,F,4,"), ["bad.csv", "'pred_cf'", "1 value(s) that are not integers"]),
    (GOOD.replace("full,3", "full,3a").replace("full,2", "full,NA"), ["bad.csv", "'true_level'", "2 value(s) that are not integers"]),
    (GOOD.replace("1,M,", "1,m,").replace("2,F,", "2,W,"), ["bad.csv", "'orig_sex'", "2 value(s) not in {F, M}"]),
    (GOOD.replace("1,M,", "1,,"), ["bad.csv", "'orig_sex'", "1 value(s) not in {F, M}"]),
    (GOOD.replace("2,F,2,2", "1,F,2,2"), ["bad.csv", "'pair_id'", "2 row(s) sharing 1 duplicated"]),
    (GOOD.replace("3,F,", ",F,"), ["bad.csv", "'pair_id'", "1 empty value(s)"]),
    (GOOD.replace("1,M,3,4,full", "1,M,3,4,"), ["bad.csv", "'condition'", "1 empty value(s)"]),
    (GOOD + "1,F,3,3,tab_iso,3\n", ["bad.csv", "'orig_sex' differs", "1 pair_id(s)"]),
])
def test_bad_input_names_file_column_and_count(tmp_path, content, needles):
    (tmp_path / "bad.csv").write_text(content)
    with pytest.raises(ValueError) as e:
        M.metrics_from_csv(tmp_path / "bad.csv", tmp_path / "out", n_boot=10)
    for needle in needles:
        assert needle in str(e.value), (needle, str(e.value))
    assert not (tmp_path / "out" / "metrics.csv").exists()


def test_duplicates_allowed_across_conditions_and_models(tmp_path):
    txt = GOOD + GOOD.splitlines()[1].replace("full", "tab_iso") + "\n"
    (tmp_path / "ok.csv").write_text(txt)
    out = M.metrics_from_csv(tmp_path / "ok.csv", tmp_path / "out", n_boot=10)
    assert set(pd.read_csv(out["metrics"]).condition) == {"full", "tab_iso"}


def test_bad_arguments():
    sex, y, yc = random_pairs(0, 20)
    with pytest.raises(ValueError, match="ci_method"):
        M.bootstrap_metrics(sex, y, yc, ci_method="basic")
    with pytest.raises(ValueError, match="n_boot"):
        M.bootstrap_metrics(sex, y, yc, n_boot=0)
    with pytest.raises(FileNotFoundError, match="no such pairs file"):
        M.read_pairs_csv("/nonexistent/pairs.csv")
