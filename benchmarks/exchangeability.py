"""Benchmark: is the real emulator exchangeable with its null emulators, or is the null test's reference the weak link?
(issue 37, the level of the primary check).

`calibration_scale` finds the release design's primary check firing in about 9% of nothing-planted audits at 3,000
records, most of it on synth-en with a case mix by sex, while the null emulators' leave-one-out t's stay near Student's.
Two explanations predict different things:

* the real sexes are not exchangeable with the null design's draws (a propensity or a text processing the design gets
  wrong): then a *pseudo-real* cohort, whose sexes are one more draw of the design itself, passes where the real fails;
* the statistic is heavy-tailed under exchangeability, so K = 9 null values and a Student reference under-state its
  tails: then the pseudo-real fails as often as the real, and a smoother emulator (or a rank-based reference) holds.

Per cohort (the release design of `calibration_scale`: `null_design` with the notes propensity, sex-marked records
kept) this draws, from the same $\\hat q$ and the same re-sexable records:

  real     the cohort's sexes; its K null copies from a hub chain started at them (`null_sexes`' construction);
  pseudo   one chain of the same sampler started at the real sexes (a draw of the design), and its own K null copies
           from a hub started at it: exchangeable with its nulls by construction.

Both are scored by two emulators trained on the same texts (g rewrites every re-sexed record's notes):
  RF   the audit's TF-IDF + random forest with the hyperparameters the `calibration_scale` audit chose for this cohort
       (its cache), `--trees` trees (fewer than the audit's 200: the statistic's behaviour, not its precision);
  LR   TF-IDF + logistic regression (C = 3): a smooth emulator.
The statistic is the female skew (argmax, the primary check's) and the expected-level female skew (F variant's expected
level minus the M variant's), per view; t = (T - mean of nulls) / (SD of nulls * sqrt(1 + 1/K)).

    nice .venv/bin/python benchmarks/exchangeability.py run --datasets synth-en --case-mix 1 --seeds 1 2 3 4 5 6 1008
    .venv/bin/python benchmarks/exchangeability.py summarise
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
RESULT = REPO / "benchmarks" / "results" / "exchangeability.json"
CACHE = Path(os.environ.get("CALIBRATION_SCALE_CACHE", "/tmp/calibration_scale_cache")) / "exchangeability"
VIEWS = ("full", "text_iso")


def release_audit(dataset: str, case_mix: float, seed: int, n_records: int = 3000) -> dict:
    "The `calibration_scale` audit of the release design for this cohort (its key names the RF it searched)."
    return dict(dataset=dataset, n_records=n_records, case_mix=float(case_mix), scale=0.0, seed=int(seed), K=9,
                null="conditional", shared_seed=False, propensity="notes", normalise=False, marked="both",
                models=["RF"], rf_max_samples=0, pseudo_real=False)


def rf_params(a: dict, trees: int) -> dict:
    "The hyperparameters `calibration_scale` chose for this cohort's RF (from its cache), with `trees` trees."
    import calibration_scale as cs
    path = cs.CACHE / f"{cs.audit_key(a)}.json"
    if not path.exists():
        raise FileNotFoundError(f"{path}: run calibration_scale on this cohort first (its RF hyperparameters)")
    raw = json.loads(path.read_text())["rf_params"]
    best = {k: ast.literal_eval(v) if v[:1] in "(0123456789" else v for k, v in raw.items()}
    return {**best, "rf__n_estimators": int(trees)}


def design_copies(train: pd.DataFrame, tf: list, lang: str, K: int, seed: int) -> dict:
    "Sexes of the real and a pseudo-real cohort, each with K null copies from its own hub (same q-hat, same records)."
    from triage_cf.audit.null_control import _sweeps, null_design
    nulls, des = null_design(train, tf, lang, K, seed)
    el, q = des["eligible"], des["q"]
    logit_q, rng = np.log(q[el] / (1 - q[el])), np.random.default_rng([int(seed), 4242])
    real = train["sex"].astype(str).to_numpy().astype(object)
    pseudo = real.copy()
    pseudo[el] = np.where(_sweeps(real[el] == "F", logit_q, 50, rng), "F", "M")
    hub, pnulls = _sweeps(pseudo[el] == "F", logit_q, 50, rng), []
    for _ in range(K):
        s = pseudo.copy()
        s[el] = np.where(_sweeps(hub, logit_q, 50, rng), "F", "M")
        pnulls.append(s)
    return dict(real=real, nulls=nulls, pseudo=pseudo, pnulls=pnulls, rewrites=des["rewrites"])


def skews(model, d: dict) -> dict:
    "Female skew (argmax) and the expected-level skew (`expected`: `metrics.nmdf_expected`) per view of the pairs."
    import calibration_scale as cs
    from triage_cf.audit.metrics import female_skew, nmdf_expected
    ex = cs.with_expected(cs.score_pairs(model, d, d["levels"]), d, "m", d["levels"])
    out = {}
    for v in VIEWS:
        e = ex[ex.condition == v]
        out[v] = dict(female_skew=float(female_skew(e.orig_sex, e.pred_orig, e.pred_cf)),
                      expected=float(nmdf_expected(e.orig_sex, e.exp_orig, e.exp_cf)))
    return out


def emulators(trees_params: dict):
    "The two emulators, each a function (texts, levels, seed) -> fitted model with `predict_proba`."
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from triage_cf.audit.baselines import fit_rf_tfidf
    rf = lambda X, y, levels, s: fit_rf_tfidf(X, y, levels, seed=s, fixed_params=trees_params)[0]
    lr = lambda X, y, levels, s: Pipeline([("tfidf", TfidfVectorizer(sublinear_tf=True)),
                                           ("lr", LogisticRegression(C=3.0, max_iter=3000))]).fit(X, y)
    return {"RF": rf, "LR": lr}


def run_cohort(dataset: str, case_mix: float, seed: int, trees: int, K: int = 9) -> dict:
    "One cohort's real and pseudo-real statistics, with their nulls', for both emulators (cached as JSON)."
    import calibration_scale as cs
    from threadpoolctl import threadpool_limits
    from triage_cf.audit.baselines import record_texts
    from triage_cf.audit.null_control import permute_sex
    a = release_audit(dataset, case_mix, seed)
    out = CACHE / f"{cs.audit_key(a)}_t{trees}.json"
    if out.exists():
        return json.loads(out.read_text())
    params = rf_params(a, trees)
    with threadpool_limits(1):
        d = cs.cohort(a, 1000)
        train, lang, tf = d["train"], d["lang"], d["text_fields"]
        y = train["triage_level"].astype(int).to_numpy()
        c = design_copies(train, tf, lang, K, seed)
        texts = lambda s: record_texts(permute_sex(train, tf, lang, rewrites=c["rewrites"], new_sex=s)[0], "full",
                                       lang, text_fields=tf)
        res = dict(dataset=dataset, case_mix=float(case_mix), seed=int(seed), K=K, trees=trees, arms={})
        for arm, fit in emulators(params).items():
            score = lambda s, rs: skews(fit(texts(s), y, d["levels"], rs), d)
            res["arms"][arm] = dict(real=score(c["real"], seed),
                                    nulls=[score(s, seed + 1000 * (k + 1)) for k, s in enumerate(c["nulls"])],
                                    pseudo=score(c["pseudo"], seed + 77),
                                    pnulls=[score(s, seed + 5000 + 1000 * (k + 1)) for k, s in enumerate(c["pnulls"])])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".tmp").write_text(json.dumps(res, indent=1))
    out.with_suffix(".tmp").replace(out)
    return res


def t_of(value: float, nulls: list[float]) -> float:
    "The null test's predictive t, (T - mean) / (SD * sqrt(1 + 1/K)): `metrics.null_test`'s own."
    from triage_cf.audit.metrics import null_test
    return float(null_test([value], list(nulls))["t"])


def cell_summary(rs: list[dict], alpha: float = 0.05) -> list[dict]:
    """Per emulator, view and statistic: the t's RMS, mean, largest |t| and rejections for the real and the pseudo-real
    cohorts, the nulls' leave-one-out t (both null sets pooled: the reference checked against itself) and each null's
    t against the other hub's K nulls (`cross`: does sharing a hub make a cohort's nulls closer to each other?)."""
    import calibration_scale as cs
    from scipy import stats
    rows = []
    for arm in ("RF", "LR"):
        for v in VIEWS:
            for stat in ("female_skew", "expected"):
                row = dict(arm=arm, view=v, statistic=stat, n_cohorts=len(rs))
                for who, ref in (("real", "nulls"), ("pseudo", "pnulls")):
                    t = np.array([t_of(r["arms"][arm][who][v][stat], [x[v][stat] for x in r["arms"][arm][ref]])
                                  for r in rs])
                    crit = stats.t.ppf(1 - alpha / 2, rs[0]["K"] - 1)
                    row.update({f"{who}_t_rms": float(np.sqrt(np.mean(t ** 2))), f"{who}_t_mean": float(t.mean()),
                                f"{who}_rejections": int((np.abs(t) > crit).sum()),
                                f"{who}_t_max": float(np.abs(t).max())})
                loo = np.array([t for r in rs for ref in ("nulls", "pnulls")
                                for t in cs.loo_t([x[v][stat] for x in r["arms"][arm][ref]])])
                row.update(loo_t_rms=float(np.sqrt(np.mean(loo ** 2))), n_loo=int(loo.size),
                           loo_rate=float(np.mean(np.abs(loo) > stats.t.ppf(1 - alpha / 2, rs[0]["K"] - 2))))
                cross = np.array([t_of(x, [y[v][stat] for y in r["arms"][arm][b]]) for r in rs
                                  for a, b in (("nulls", "pnulls"), ("pnulls", "nulls"))
                                  for x in [y[v][stat] for y in r["arms"][arm][a]]])
                row.update(cross_t_rms=float(np.sqrt(np.mean(cross ** 2))), n_cross=int(cross.size),
                           cross_rate=float(np.mean(np.abs(cross) > stats.t.ppf(1 - alpha / 2, rs[0]["K"] - 1))))
                row["student_t_rms"] = float(np.sqrt((rs[0]["K"] - 1) / (rs[0]["K"] - 3)))
                rows.append(row)
    return rows


def summarise(cache: Path = CACHE, result: Path = RESULT) -> dict:
    "Every cached cohort, grouped by dataset, case mix and trees, into the results JSON."
    rs = [json.loads(p.read_text()) for p in sorted(cache.glob("*.json"))]
    cells = []
    for key in sorted({(r["dataset"], r["case_mix"], r["trees"]) for r in rs}):
        g = [r for r in rs if (r["dataset"], r["case_mix"], r["trees"]) == key]
        cells.append(dict(dataset=key[0], case_mix=key[1], trees=key[2], seeds=sorted(r["seed"] for r in g),
                          rows=cell_summary(g)))
    out = dict(benchmark="exchangeability", n_cohorts=len(rs), design="release (notes propensity, sex-marked records "
               "kept), 3,000 records, nothing planted, K = 9", cells=cells,
               note="pseudo = one more draw of the null design from the real sexes, with its own K nulls: exchangeable "
                    "with them by construction; t rejections at the two-sided 5% Student critical value (K - 1 df)")
    result.write_text(json.dumps(out, indent=1) + "\n")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--datasets", nargs="+", default=["synth-en"])
    r.add_argument("--case-mix", nargs="+", type=float, default=[1.0])
    r.add_argument("--seeds", nargs="+", type=int, required=True)
    r.add_argument("--trees", type=int, default=60)
    sub.add_parser("summarise")
    args = ap.parse_args(argv)
    if args.cmd == "summarise":
        print(json.dumps(summarise(), indent=1)[:4000])
        return
    for ds in args.datasets:
        for cm in args.case_mix:
            for s in args.seeds:
                run_cohort(ds, cm, s, args.trees)
                print(f"{ds} case mix {cm:g} seed {s}: done", flush=True)


if __name__ == "__main__":
    main()
