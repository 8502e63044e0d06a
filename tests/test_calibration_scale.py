"""The statistics `benchmarks/calibration_scale.py` reports about the audit's test (issue 37): the number of
nothing-planted audits a level needs, the clustered standard error of the mean t, and the test's own calibration
(the real emulator's t beside its nulls' leave-one-out t). Hand-computed cases; no cohort is built."""
import importlib.util
import sys

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.proportion import proportion_confint

from triage_cf.core import repo_root


@pytest.fixture(scope="module")
def cs():
    path = repo_root() / "benchmarks" / "calibration_scale.py"
    spec = importlib.util.spec_from_file_location("calibration_scale_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_pooled_audits_needed(cs):
    n = cs.pooled_audits_needed()
    assert n == 160 == cs.GRID["pooled"]
    # at n, ceil(5% of n) false findings verify the 5% level (upper bound < 10%); one step fewer audits do not
    assert proportion_confint(8, 160, method="beta")[1] < 0.10
    assert proportion_confint(int(np.ceil(0.05 * 150)), 150, method="beta")[1] >= 0.10
    assert cs.pooled_audits_needed(level=0.0) == 40          # 0 of 30: upper bound 1 - 0.025^(1/30) = 0.116; of 40: 0.088
    assert cs.pooled_audits_needed(level=0.05, bound=0.20) < n


def _audit(dataset, seed, t, K=9, view="full", metric="female_skew"):
    return dict(dataset=dataset, seed=seed, K=K,
                checks=[dict(condition=view, metric=metric, effect=t, null_sd=1.0)])


def test_mean_t_standard_error_by_cluster(cs):
    # two audits of one seed (the same generator draws at two case mixes) count as one cluster
    fit = [_audit("synth-en", 1, 2.0), _audit("synth-en", 1, 0.0), _audit("synth-en", 2, -1.0), _audit("synth-fr", 1, 0.0)]
    got = cs._t_of(fit, "female_skew", "full")
    assert got["n_clusters"] == 3
    assert got["mean"] == pytest.approx(0.25)                 # the mean over audits
    means = np.array([1.0, -1.0, 0.0])                        # the clusters' means
    assert got["se"] == pytest.approx(means.std(ddof=1) / np.sqrt(3))
    assert cs._t_of([], "female_skew", "full") == dict(mean=None, se=None, n_clusters=0)


def test_loo_t(cs):
    v = [0.0, 1.0, 2.0, 3.0]
    got = cs.loo_t(v)
    o = np.array([1.0, 2.0, 3.0])                             # the first null against the other three
    assert got[0] == pytest.approx((0.0 - o.mean()) / (o.std(ddof=1) * np.sqrt(1 + 1 / 3)))
    assert got[0] == pytest.approx(-got[3])                   # symmetric values, symmetric t
    assert cs.loo_t([1.0, 1.0, 1.0]) == []                     # no spread among the others: untested


def test_t_calibration(cs):
    rng = np.random.default_rng(0)
    K, crit = 9, stats.t.ppf(0.975, 8)
    fit = []
    for i in range(400):                                      # a real emulator exchangeable with its nulls
        vals = rng.normal(size=K + 1)
        real, nulls = vals[0], vals[1:]
        effect, sd = real - nulls.mean(), nulls.std(ddof=1)
        a = _audit("synth-en", i, effect, K)
        a["checks"][0]["null_sd"] = sd
        a["emulator_values"] = {"full": {"female_skew": {"real": real, "nulls": list(nulls)}}}
        fit.append(a)
    got = cs.t_calibration(fit, "full")
    assert got["n_real"] == 400 and got["n_audits_loo"] == 400 and got["n_loo"] == 400 * K
    assert got["student_sd_real"] == pytest.approx(np.sqrt(8 / 6))
    assert abs(got["real_t_rms"] - got["student_sd_real"]) < 0.15
    assert abs(got["loo_t_rms"] - got["student_sd_loo"]) < 0.08
    assert 0.02 < got["real_t_rate"] < 0.08 and 0.035 < got["loo_t_rate"] < 0.065
    ts = [a["checks"][0]["effect"] / a["checks"][0]["null_sd"] / np.sqrt(1 + 1 / K) for a in fit]
    assert got["real_t_rate"] == pytest.approx(np.mean(np.abs(ts) > crit))
    for a in fit:                                             # a real emulator that stands apart: offset by 3 null SDs
        a["checks"][0]["effect"] += 3 * a["checks"][0]["null_sd"]
    off = cs.t_calibration(fit, "full")
    assert off["real_t_mean"] > 2.5 and off["real_t_rate"] > 0.5
    assert off["loo_t_rms"] == pytest.approx(got["loo_t_rms"])   # the nulls' own calibration does not move


def test_assoc_calibration(cs):
    rng = np.random.default_rng(1)
    K = 9
    fit, gaps = [], []
    for i in range(300):                                      # exchangeable gaps; the emulator's t = 1.5 x the gap's t
        vals = rng.normal(size=K + 1)
        g = (vals[0] - vals[1:].mean()) / (vals[1:].std(ddof=1) * np.sqrt(1 + 1 / K))
        a = _audit("synth-en", i, 1.5 * g * np.sqrt(1 + 1 / K), K)
        a["checks"][0]["check"] = "primary"
        a["null_diagnostics"] = {"sex_level_assoc": {"real": vals[0], "nulls": list(vals[1:])}}
        fit.append(a)
        gaps.append(g)
    got = cs.assoc_calibration(fit)
    assert got["n"] == 300
    assert got["gap_t_mean"] == pytest.approx(np.mean(gaps))
    assert got["gap_t_rms"] == pytest.approx(np.sqrt(np.mean(np.square(gaps))))
    assert abs(got["gap_t_rms"] - np.sqrt(8 / 6)) < 0.15       # Student's t with K - 1 df
    assert got["slope_emulator_on_gap"] == pytest.approx(1.5) and got["corr"] == pytest.approx(1.0)
    del fit[0]["null_diagnostics"]                            # an audit without the statistic is left out, not zero
    assert cs.assoc_calibration(fit)["n"] == 299
    assert cs.assoc_calibration([])["n"] == 0 and cs.assoc_calibration([])["slope_emulator_on_gap"] is None


def test_sex_level_assoc(cs):
    import pandas as pd
    train = pd.DataFrame({"sex": ["F", "F", "M", "M", "F"], "triage_level": [3, 5, 2, 2, 1]})
    eligible = np.array([True, True, True, True, False])     # the last record keeps its sex: not counted
    null = np.array(["M", "F", "F", "M", "F"], dtype=object)
    got = cs.sex_level_assoc(train, eligible, [null])
    assert got["real"] == pytest.approx(4.0 - 2.0) and got["nulls"] == [pytest.approx(3.5 - 2.5)]


def test_generator_propensity(cs):
    """The synthetic cohort's own P(F | x) is calibrated (a logistic fit of the sexes on its logit has slope about 1),
    carries the case mix at case_mix_by_sex 2 and none at 0, and refuses records its generator did not draw."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from triage_cf.data import load_records
    for cm in (2.0, 0.0):
        a = dict(dataset="synth-en", n_records=3000, case_mix=cm, scale=0.0, seed=5)
        rec = load_records("synth-en", seed=5, synth=cs.synth_knobs("synth-en", 3000, cm, 0.0))[0]
        rec = rec[rec["sex"].isin(["F", "M"])].reset_index(drop=True)
        q = cs.generator_propensity(rec, a)
        female = (rec["sex"] == "F").to_numpy()
        assert abs(q.mean() - female.mean()) < 0.03
        if cm:
            fit = LogisticRegression(C=1e6).fit(np.log(q / (1 - q))[:, None], female)
            assert 0.8 < fit.coef_[0][0] < 1.35 and roc_auc_score(female, q) > 0.65
        else:   # sex independent of the case mix: the prior, but for the sex-specific (genital) complaints
            assert (np.abs(q - np.median(q)) < 1e-9).mean() > 0.95 and abs(np.median(q) - 0.555) < 1e-9
            one_sex = (q < 1e-5) | (q > 1 - 1e-5)                   # a complaint only one sex can have
            assert one_sex.any() and (female[one_sex] == (q[one_sex] > 0.5)).all()
    with pytest.raises(ValueError, match="do not match"):
        cs.generator_propensity(rec, {**a, "seed": 6})


def test_q_generator_corr(cs):
    rng = np.random.default_rng(2)
    lt = rng.normal(size=500)
    q_true, q_hat = 1 / (1 + np.exp(-lt)), 1 / (1 + np.exp(-(lt + rng.normal(size=500))))
    assert cs.q_generator_corr(q_hat, q_true) == pytest.approx(np.corrcoef(np.log(q_hat / (1 - q_hat)), lt)[0, 1])
    assert cs.q_generator_corr(q_true, q_true) == pytest.approx(1.0)
    assert cs.q_generator_corr(q_hat, np.full(500, 0.55)) is None          # no case mix: nothing to agree with


def test_paired_designs(cs):
    def audit(seed, propensity, t, normalise=False):
        return dict(model="RF", dataset="synth-en", n_records=3000, case_mix=2.0, seed=seed, scale=0.0, K=9,
                    fit_for_audit=True, null="conditional", propensity=propensity, marked="both renderings",
                    normalise=normalise, shared_seed=False, rf_max_samples=0, pseudo_real=False,
                    checks=[dict(check="primary", effect=t * np.sqrt(1 + 1 / 9), null_sd=1.0)])
    rs = [audit(s, "notes", t) for s, t in ((1, 1.0), (2, -2.0), (3, 3.0))]
    rs += [audit(s, "generator", t) for s, t in ((1, 1.5), (2, -1.0), (3, 2.0), (4, 9.0))]   # seed 4: no release twin
    got = cs.paired_designs(rs)
    assert len(got) == 1 and got[0]["design"] == "generator" and got[0]["n"] == 3
    assert got[0]["corr"] == pytest.approx(np.corrcoef([1.0, -2.0, 3.0], [1.5, -1.0, 2.0])[0, 1])
    assert got[0]["release_rms"] == pytest.approx(np.sqrt(14 / 3)) and got[0]["design_rms"] == pytest.approx(np.sqrt(7.25 / 3))
    crit = stats.t.ppf(0.975, 8)                                 # 2.31: |3.0| rejects, |2.0| and |-2.0| do not
    assert (got[0]["release_rejections"], got[0]["design_rejections"]) == (1, 0) and 2.0 < crit < 3.0


def _ev_audit(real, nulls, seed=1, K=None, scale=0.0, oracle=0.0, rate_k=0, rate_n=1):
    "A finished audit with only what `primary_tests` and the records read."
    K = len(nulls) if K is None else K
    return dict(key=f"v1_x_s{seed}_K{K}", version=1, dataset="synth-en", seed=seed, K=K, scale=scale,
                checks=[dict(check="primary", condition="full", metric="female_skew", oracle_estimate=oracle)],
                emulator_values={"full": {"female_skew": {"real": real, "nulls": list(nulls)}}})


def test_primary_tests_three_ways(cs):
    nulls = list(np.linspace(-1, 1, 40))
    # beyond every null: the rank test (K = 40) rejects (p = 2/41); the t with the first 9 nulls (-1 .. -0.59, sd
    # about 0.14) and with all 40 reject too
    got = cs.primary_tests([_ev_audit(1.5, nulls)])
    assert set(got) == {"t, K = 9", "t, K = 40", "rank, K = 40"}
    assert all(v["k"] == 1 and v["n"] == 1 for v in got.values())
    # inside the nulls' range: the rank test cannot reject, whatever the t says
    got = cs.primary_tests([_ev_audit(0.99, nulls), _ev_audit(-1.5, nulls, seed=2)])
    assert got["rank, K = 40"]["k"] == 1 and got["rank, K = 40"]["n"] == 2
    # planted: a rejection counts as power only with the oracle's sign
    got = cs.primary_tests([_ev_audit(-1.5, nulls, scale=1.0, oracle=0.02)])
    assert got["rank, K = 40"]["k"] == 0
    # K = 9: one test, no rank test (2/10 is not below 0.05)
    assert set(cs.primary_tests([_ev_audit(3.0, nulls[:9])])) == {"t, K = 9"}


def test_level_rows_by_test(cs):
    cell = lambda K, k, n, pt=None: dict(model="RF", K=K, n_records=3000, n_pairs_median=1300.0, case_mix=1.0,
                                         dataset="synth-en", argmax=dict(rate=dict(k=k, n=n)),
                                         **({"primary_tests": pt} if pt else {}))
    rows = cs.level_rows([cell(9, 3, 40), cell(40, 1, 20, {"t, K = 9": dict(k=2, n=20)})])
    by = {r["test"]: r for r in rows}
    assert (by["rank"]["k"], by["rank"]["n"], by["rank"]["K"]) == (1, 20, [40])
    assert (by["t"]["k"], by["t"]["n"], by["t"]["K"]) == (5, 60, [9, 40])   # K = 9 audits + the K = 40 ones' first 9


def test_audit_records_survive_the_cache(cs, tmp_path):
    import json
    cache, rec = tmp_path / "cache", tmp_path / "audits.jsonl.gz"
    cache.mkdir()
    (cache / "v1_a.json").write_text(json.dumps(dict(key="v1_a", x=1)))
    assert [r["key"] for r in cs.audit_records(cache, rec)] == ["v1_a"]
    first = rec.read_bytes()
    (cache / "v1_a.json").unlink()                            # a new machine: the cache is gone, the records are not
    (cache / "v1_b.json").write_text(json.dumps(dict(key="v1_b", x=2)))
    assert [r["key"] for r in cs.audit_records(cache, rec)] == ["v1_a", "v1_b"]
    (cache / "v1_b.json").unlink()
    cs.audit_records(cache, rec)
    assert cs.audit_records(cache, rec) == [dict(key="v1_a", x=1), dict(key="v1_b", x=2)]
    assert rec.read_bytes() != first                          # and the same audits give the same bytes:
    again = rec.read_bytes(); cs.audit_records(cache, rec); assert rec.read_bytes() == again


def test_carried_over(cs):
    old = [dict(K=9, cm=1.0, n_audits=5), dict(K=9, cm=2.0, n_audits=4)]
    new = [dict(K=9, cm=2.0, n_audits=1)]
    got = cs.carried_over(old, new, lambda c: (c["K"], c["cm"]))
    assert len(got) == 1 and got[0]["cm"] == 1.0 and "not kept" in got[0]["records"]
