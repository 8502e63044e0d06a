"""Benchmark: every bias metric with 1,000-resample bootstrap CIs for 72,444 pairs (the paper's test size),
triage_cf.audit.metrics (category-count multinomial bootstrap) vs a straightforward per-resample pandas implementation
kept here for comparison, run side by side on the same pairs. Writes benchmarks/results/metrics.json.

    .venv/bin/python benchmarks/metrics_bench.py [--n-boot 1000] [--ref-resamples 1000] [--repeats 5]

Targets: < 2 s and >= 20x faster than the reference on the 2-core machine. The machine may be shared:
the load average is recorded before and after.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import pandas as pd

from triage_cf.core import write_json
from triage_cf.audit.metrics import METRICS, bootstrap_metrics, table3

N_MALE, N_FEMALE = 40_082, 32_362   # the paper's Bordeaux test partition (section 3.3)


def synthetic_pairs(seed: int = 0) -> pd.DataFrame:
    "72,444 pairs with the paper's direction counts and changes of about the paper's size (PDR ~ 8%)."
    rng = np.random.default_rng(seed)
    sex = np.r_[np.full(N_MALE, "M"), np.full(N_FEMALE, "F")]
    y = rng.choice([2, 3, 4, 5], size=sex.size, p=[0.18, 0.41, 0.37, 0.04])
    u = rng.random(sex.size)
    up = np.where(sex == "M", u < 0.049, u < 0.0375)
    down = ~up & (rng.random(sex.size) < np.where(sex == "M", 0.036, 0.046))
    yc = np.clip(y + up.astype(int) - down.astype(int), 1, 5)
    return pd.DataFrame({"pair_id": np.arange(sex.size).astype(str), "orig_sex": sex, "pred_orig": y, "pred_cf": yc,
                         "condition": "full"})


# ------------------------------------------------------------------ the straightforward reference
def reference_point(df: pd.DataFrame) -> dict:
    "All metrics of one (resampled) pair table with plain pandas."
    d = df.pred_cf - df.pred_orig
    g = df.assign(up=d > 0, down=d < 0).groupby("orig_sex")[["up", "down"]].mean()
    pu_mf, pd_mf = g.loc["M", "up"], g.loc["M", "down"]
    pu_fm, pd_fm = g.loc["F", "up"], g.loc["F", "down"]
    fm = np.where(df.orig_sex == "M", d, -d)
    return {"PDR": (d != 0).mean(), "P_up_M_to_F": pu_mf, "P_down_M_to_F": pd_mf, "P_up_F_to_M": pu_fm,
            "P_down_F_to_M": pd_fm, "DTS_M_to_F": pu_mf - pd_mf, "DTS_F_to_M": pu_fm - pd_fm,
            "NATS_up": pu_fm - pu_mf, "NATS_down": pd_fm - pd_mf, "NMDF": fm.mean(),
            "female_skew": (pu_mf - pd_mf) - (pu_fm - pd_fm)}


def reference_bootstrap(df: pd.DataFrame, n_boot: int, seed: int) -> pd.DataFrame:
    "Resample pair indices n_boot times, recompute every metric with pandas, take percentiles."
    rng = np.random.default_rng(seed)
    n = len(df)
    boots = [reference_point(df.iloc[rng.integers(0, n, n)]) for _ in range(n_boot)]
    b = pd.DataFrame(boots)
    est = reference_point(df)
    return pd.DataFrame({"metric": list(METRICS), "estimate": [est[m] for m in METRICS],
                         "ci_low": [b[m].quantile(0.025) for m in METRICS],
                         "ci_high": [b[m].quantile(0.975) for m in METRICS]})


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--ref-resamples", type=int, default=1000,
                    help="resamples run by the reference (its time is scaled to --n-boot if fewer)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "metrics.json"))
    a = ap.parse_args(argv)

    load_before = os.getloadavg()
    df = synthetic_pairs()
    s, y, yc = df.orig_sex.to_numpy(), df.pred_orig.to_numpy(), df.pred_cf.to_numpy()

    fast_core, fast_table = [], []
    for r in range(a.repeats):
        t0 = time.perf_counter()
        ours = bootstrap_metrics(s, y, yc, n_boot=a.n_boot, seed=r)
        fast_core.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        table3(df, n_boot=a.n_boot, seed=r)           # incl. validation of the pair table
        fast_table.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    bca = bootstrap_metrics(s, y, yc, n_boot=a.n_boot, seed=0, ci_method="bca")
    t_bca = time.perf_counter() - t0

    t0 = time.perf_counter()
    ref = reference_bootstrap(df, a.ref_resamples, seed=0)
    t_ref_run = time.perf_counter() - t0
    t_ref = t_ref_run * a.n_boot / a.ref_resamples
    load_after = os.getloadavg()

    ours = bootstrap_metrics(s, y, yc, n_boot=a.n_boot, seed=0)
    half = (ours.ci_high - ours.ci_low).to_numpy() / 2
    est_diff = float(np.max(np.abs(ours.estimate.to_numpy() - ref.estimate.to_numpy())))
    ci_diff = float(np.max(np.maximum(np.abs(ours.ci_low - ref.ci_low), np.abs(ours.ci_high - ref.ci_high)) / half))

    t_fast = statistics.median(fast_table)
    res = {
        "task": "all issue-7 metrics with bootstrap percentile CIs, one condition",
        "n_pairs": int(len(df)), "n_boot": a.n_boot,
        "triage_cf_bootstrap_metrics_s": {"median": statistics.median(fast_core), "all": fast_core},
        "triage_cf_table3_s": {"median": t_fast, "all": fast_table},
        "triage_cf_bca_s": t_bca,
        "reference_pandas_s": t_ref, "reference_resamples_run": a.ref_resamples, "reference_run_s": t_ref_run,
        "speedup_vs_reference": t_ref / t_fast,
        "targets": {"under_2_s": t_fast < 2.0, "at_least_20x": t_ref / t_fast >= 20},
        "agreement": {"max_abs_estimate_diff": est_diff,
                      "max_ci_endpoint_diff_in_half_widths": ci_diff,
                      "note": "different random resamples (multinomial category counts vs pair indices): CI endpoints "
                              "agree up to Monte-Carlo error, estimates exactly"},
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "numpy": np.__version__, "pandas": pd.__version__,
                    "loadavg_before": load_before, "loadavg_after": load_after,
                    "note": "shared machine: the load average (1, 5, 15 min) shows how busy it was"},
    }
    write_json(a.out, res)
    print(f"triage_cf table3: {t_fast:.3f} s (median of {a.repeats}); bootstrap core {statistics.median(fast_core):.3f} s; "
          f"BCa {t_bca:.3f} s")
    print(f"reference pandas: {t_ref:.1f} s for {a.n_boot} resamples (ran {a.ref_resamples} in {t_ref_run:.1f} s)")
    print(f"speed-up {t_ref / t_fast:.0f}x; max estimate diff {est_diff:.2e}; max CI endpoint diff {ci_diff:.2f} half-widths")
    print(f"load average before {load_before}, after {load_after}; wrote {a.out}")
    return res


if __name__ == "__main__":
    main()
