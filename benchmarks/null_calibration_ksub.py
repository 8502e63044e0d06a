"""Benchmark: the audit's test at smaller K, from the calibration's own audits (issue 24; no new training).

The default profile tests RF and MLP with K = 9 null emulators each (cost), the calibration benchmark
(`null_calibration.py`) trained K = 19 per audit. This re-applies `metrics.permutation_test` to every fit audit of its
cache with only the first K' null emulators (RF_null0 .. RF_null{K'-1}, MLP_null0 ..: the first K' permutations and training seeds, as a
run with `null_seeds: K'` would train them) on the same pairs, and reports the same rates: per check (Wilson 95% CI),
the primary check, any finding (family-wise); nothing planted = false-positive rates, planted = power; and the
primary check's median MDE. Reads the cache only; fitness verdicts are the audits' own.

    .venv/bin/python benchmarks/null_calibration_ksub.py [K' ...]     # default: 9 4 19

Writes benchmarks/results/null_calibration_ksub.json.
"""
from __future__ import annotations

import glob
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from statsmodels.stats.proportion import proportion_confint

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("null_calibration", REPO / "benchmarks" / "null_calibration.py")
nc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(nc)


def audit_tests(r: dict, Ks) -> list[dict]:
    from triage_cf.audit.metrics import permutation_test
    from triage_cf.audit.predict import pairs_for_metrics
    prm = nc.chain_params(r["dataset"])
    synth = {**dict(prm["synth"]), "n_records": r["n_records"], "bias_tab": r["bias_tab"], "bias_text": r["bias_text"]}
    d = nc.build_cohort(r["dataset"], r["seed"], synth, float(prm.get("test_size", 0.5)), prm.get("ft_eval_n"))
    work, m = nc.CACHE / "models" / r["key"], nc.model_of(r)
    real = pairs_for_metrics(pd.read_parquet(work / f"{m}_pairs.parquet"), d["ok"], m)
    nulls = [pairs_for_metrics(pd.read_parquet(work / f"{m}_null{k}_pairs.parquet"), d["ok"], m).assign(null_id=f"{m}_null{k}")
             for k in range(r["K"])]
    fit = pd.DataFrame({"model": [m], "fit_for_audit": [True]})
    out = []
    for K in Ks:
        pt = permutation_test(real, pd.concat(nulls[:K], ignore_index=True), fit, n_boot=200, seed=r["seed"])
        prim = pt[pt.check == "primary"].iloc[0]
        out.append(dict(key=r["key"], model=m, dataset=r["dataset"], scale=r["scale"], seed=r["seed"], K=K,
                        n_checks=len(pt), n_findings=int(pt.finding.sum()), primary_finding=bool(prim.finding),
                        primary_mde=float(prim.mde)))
    return out


def rate(k: int, n: int) -> dict:
    lo, hi = proportion_confint(k, n, method="wilson") if n else (None, None)
    return dict(k=int(k), n=int(n), rate=k / n if n else None, ci_low=lo, ci_high=hi)


def main(argv=None) -> None:
    Ks = [int(k) for k in (argv if argv is not None else sys.argv[1:])] or [9, 4, 19]
    t0 = time.perf_counter()
    audits = [json.load(open(f)) for pat in (f"v{nc.VERSION}_*.json", f"v{nc.VERSION}mlp_*.json")
              for f in sorted(glob.glob(str(nc.CACHE / pat)))]
    fit = [r for r in audits if r["fit_for_audit"] and not r.get("search_nulls")]
    rows = [x for r in fit for x in audit_tests(r, [K for K in Ks if K <= r["K"]])]
    arms, md = [], ["| model | K | planted | fit audits | per-check rate [Wilson 95%] | primary check | any finding | primary MDE (median, points) |",
                    "|---|---|---|---|---|---|---|---|"]
    for m, K, sc in [(m, K, sc) for m in nc.MODELS for K in Ks for sc in sorted({x["scale"] for x in rows})]:
            g = [x for x in rows if x["model"] == m and x["K"] == K and x["scale"] == sc]
            if not g:
                continue
            a = dict(model=m, K=K, scale=sc, n_audits=len(g), per_check=rate(sum(x["n_findings"] for x in g), sum(x["n_checks"] for x in g)),
                     primary=rate(sum(x["primary_finding"] for x in g), len(g)),
                     family_wise=rate(sum(x["n_findings"] > 0 for x in g), len(g)),
                     primary_mde_median=float(np.median([x["primary_mde"] for x in g])))
            arms.append(a)
            pc = a["per_check"]
            md.append(f"| {m} | {K} | {'nothing' if sc == 0 else f'{sc:g}x default'} | {len(g)} | {100 * pc['rate']:.1f}% "
                      f"[{100 * pc['ci_low']:.1f}, {100 * pc['ci_high']:.1f}] ({pc['k']}/{pc['n']}) | {a['primary']['k']}/{len(g)} | "
                      f"{a['family_wise']['k']}/{len(g)} | {100 * a['primary_mde_median']:.1f} |")
    res = dict(benchmark="null_calibration_ksub", issue=24, source="the cached audits of benchmarks/null_calibration.py "
               f"(v{nc.VERSION}, RF and MLP arms, K = 19 trained per audit)", n_fit_audits=len(fit), Ks=Ks, arms=arms,
               markdown="\n".join(md), audits=rows, wall_s=round(time.perf_counter() - t0, 1),
               note="the first K' null emulators of each audit, as a run with null_seeds K' trains them; pairs and "
                    "fitness verdicts are the audits' own; n_boot 200 (the CI only: p, q and findings do not depend on it)")
    out = REPO / "benchmarks" / "results" / "null_calibration_ksub.json"
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(res["markdown"])
    print(f"{len(fit)} fit audits -> {out} ({res['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
