"""`benchmarks/exchangeability.py` (issue 37): the predictive t, the per-cell summary it reports, and the pseudo-real
draw (one more draw of the null design: the same records re-sexable, the same number of women among them)."""
import importlib
import sys

import numpy as np
import pytest
from scipy import stats

from triage_cf.core import repo_root


@pytest.fixture(scope="module")
def ex():
    sys.path.insert(0, str(repo_root() / "benchmarks"))   # the benchmark imports calibration_scale from there
    return importlib.import_module("exchangeability")


def test_t_of(ex):
    nulls = [1.0, 2.0, 3.0, 4.0]                       # mean 2.5, SD 1.2910, K = 4
    assert ex.t_of(5.0, nulls) == pytest.approx(2.5 / (np.std(nulls, ddof=1) * np.sqrt(1.25)))
    assert ex.t_of(2.5, nulls) == 0.0


_BASE = list(np.linspace(-1, 1, 9) / np.linspace(-1, 1, 9).std(ddof=1))    # 9 nulls: mean 0, SD exactly 1


def _cohort(seed, t_real, t_pseudo, K=9):
    "A cached cohort whose real and pseudo statistics sit at the given predictive t from nulls with SD 1."
    scale = np.sqrt(1 + 1 / K)
    val = lambda t: {v: dict(female_skew=t * scale, expected=t * scale) for v in ex_views()}
    nul = [{v: dict(female_skew=b, expected=b) for v in ex_views()} for b in _BASE]
    arm = dict(real=val(t_real), nulls=nul, pseudo=val(t_pseudo), pnulls=nul)
    return dict(seed=seed, K=K, arms={"RF": arm, "LR": arm})


def ex_views():
    return ("full", "text_iso")


def test_cell_summary(ex):
    crit = stats.t.ppf(0.975, 8)
    rs = [_cohort(1, 3.0, 0.0), _cohort(2, -1.0, crit + 0.01), _cohort(3, 0.0, 1.0)]
    row = [r for r in ex.cell_summary(rs) if (r["arm"], r["view"], r["statistic"]) == ("RF", "full", "female_skew")][0]
    assert row["real_t_rms"] == pytest.approx(np.sqrt((9 + 1) / 3))
    assert row["real_rejections"] == 1 and row["pseudo_rejections"] == 1
    assert row["real_t_mean"] == pytest.approx(2 / 3) and row["real_t_max"] == pytest.approx(3.0)
    assert row["student_t_rms"] == pytest.approx(np.sqrt(8 / 6))
    loo = [ex.t_of(b, [c for c in _BASE if c != b]) for b in _BASE]
    assert row["n_loo"] == 3 * 2 * 9 and row["loo_t_rms"] == pytest.approx(np.sqrt(np.mean(np.square(loo))))
    assert row["loo_rate"] == np.mean(np.abs(loo) > stats.t.ppf(0.975, 7))
    cross = np.sqrt(np.mean(np.square(_BASE))) / np.sqrt(1 + 1 / 9)     # each null against the same 9 (SD 1, mean 0)
    assert row["n_cross"] == 3 * 2 * 9 and row["cross_t_rms"] == pytest.approx(cross)



def test_design_copies(ex):
    """The pseudo-real sexes and every null copy re-sex only the re-sexable records and keep their number of women;
    the pseudo-real differs from the real (it is a draw, not a copy)."""
    from triage_cf.audit.null_control import null_design
    from triage_cf.data import load_records
    rec = load_records("synth-en", seed=3, synth={"n_records": 400, "case_mix_by_sex": 2.0})[0]
    rec = rec[rec["sex"].isin(["F", "M"])].reset_index(drop=True)
    tf = ["note"]
    c = ex.design_copies(rec, tf, "en", 3, seed=11)
    el = null_design(rec, tf, "en", 1, 11)[1]["eligible"]
    real = rec["sex"].astype(str).to_numpy()
    assert (c["real"] == real).all() and el.sum() > 100
    for s in [c["pseudo"]] + c["nulls"] + c["pnulls"]:
        assert (s[~el] == real[~el]).all() and (s[el] == "F").sum() == (real[el] == "F").sum()
    assert (c["pseudo"] != real).sum() > 10
