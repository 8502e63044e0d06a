"""Benchmark: does the subgroup analysis find a bias planted in one complaint category, and only there? (issue 38)

Each audit generates a synthetic cohort with the sex effect planted in one complaint class only (`bias_local`, acting
through the recorded sex field on `bias_local_cc` = CARD01, the chest-pain class, which the audit's complaint map puts
in the category "chest pain"; `bias_tab` = `bias_text` = 0: the rest of the cohort is unbiased), rebuilds the default
profile's chain for the RF arm through the package's functions (`benchmarks/null_calibration.py`: cohort rules, split,
rule rewriter's pairs, TF-IDF + random forest with its hyperparameter search, K null RFs on sex-permuted training
records), and runs `subgroups.subgroup_table` on the RF's pairs against its K null RFs. The oracle (the planted
labelling process, which knows the effect) scores the same pairs: its per-category female skew is the truth.

Per audit it records, for the complaint-category family in the full view: each category's female skew (RF and oracle),
the test's p, q, MDE and finding flag. `summarise` counts: the planted category flagged with the oracle's sign
(recovery), and flags in the other categories (false flags per tested category: the family's false-positive rate).

The cohort size: the audit's power curve (`plan.detectable_size`, RF, case mix 1) gives the whole cohort's MDE at a
size; the chest-pain category holds a share s of it, so its MDE is about the curve's at s x n records. The script records
that figure (`mde_curve_at_category_size`) beside the planted effect the RF shows, so the chapter can say whether the
size was enough.

    nice -n 19 .venv/bin/python benchmarks/localised_bias.py run [--datasets synth-en synth-fr] [--seeds 3] [--n-records 12000]
    .venv/bin/python benchmarks/localised_bias.py summarise

Each finished audit writes one JSON under $LOCALISED_BIAS_CACHE (default /tmp/localised_bias_cache), skipped on rerun
(a stopped run resumes at the audit it was in, with its cached models); `summarise` also keeps the audits already in
benchmarks/results/localised_bias.json, so results survive a new machine.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
RESULT = REPO / "benchmarks" / "results" / "localised_bias.json"
CACHE = Path(os.environ.get("LOCALISED_BIAS_CACHE", "/tmp/localised_bias_cache"))
PLANTED_CC, PLANTED_CATEGORY = "CARD01", "chest pain"
VERSION = 1


def audit_key(dataset: str, seed: int, n_records: int, bias_local: float, K: int) -> str:
    return f"v{VERSION}_{dataset}_n{n_records}_b{bias_local:g}_K{K}_s{seed}"


def knobs(dataset: str, n_records: int, bias_local: float) -> tuple[dict, dict]:
    "(the default profile's parameters, generator knobs: the localised effect only)."
    from null_calibration import chain_params
    prm = chain_params(dataset)
    return prm, {**dict(prm["synth"]), "n_records": int(n_records), "bias_tab": 0.0, "bias_text": 0.0,
                 "bias_local": float(bias_local), "bias_local_cc": PLANTED_CC}


def rf_and_nulls(d: dict, seed: int, K: int, work: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    "The real RF's pair table, its K null RFs' (`null_id`) and its Table 2 test predictions, cached under `work`."
    import triage_cf.audit.null_control as null_control
    from null_calibration import _cached, fit_and_score
    from triage_cf.audit.baselines import record_texts
    from triage_cf.audit.predict import pairs_for_metrics
    train, lang, tf = d["train"], d["lang"], d["text_fields"]
    y = train["triage_level"].astype(int).to_numpy()
    test_pred, pair_pred, best = _cached(work / "RF", lambda: fit_and_score(record_texts(train, "full", lang, text_fields=tf), y, d, seed))
    best = {k: tuple(v) if isinstance(v, list) else v for k, v in best.items()}
    nulls = []
    for k in range(K):
        def make(k=k):
            permuted, _ = null_control.permute_sex(train, tf, lang, seed=[int(seed), k])
            return fit_and_score(record_texts(permuted, "full", lang, text_fields=tf), y, d, seed=int(seed) + 1000 * (k + 1),
                                 best_params=best)
        nulls.append(pairs_for_metrics(_cached(work / f"RF_null{k}", make)[1], d["ok"], "RF").assign(null_id=f"RF_null{k}"))
    return pairs_for_metrics(pair_pred, d["ok"], "RF"), pd.concat(nulls, ignore_index=True), test_pred


def category_rows(st: pd.DataFrame, model: str) -> list[dict]:
    "The female skew of each complaint category (full view) of one model, as recorded."
    g = st[(st.model == model) & (st.condition == "full") & (st.family == "complaint_category") & (st.metric == "female_skew")]
    num = lambda v: None if pd.isna(v) else float(v)
    return [dict(category=r.subgroup, n_pairs=int(r.n_pairs), estimate=num(r.estimate), ci=[num(r.ci_low), num(r.ci_high)],
                 null_median=num(r.null_median), p=num(r.p), q=num(r.q), mde=num(r.mde),
                 finding=None if pd.isna(r.finding) else bool(r.finding), test=str(r.test)) for r in g.itertuples()]


def run_audit(dataset: str, seed: int, n_records: int, bias_local: float, K: int, n_boot: int) -> dict:
    from threadpoolctl import threadpool_limits
    from null_calibration import build_cohort, memoise_rewrites
    from triage_cf.audit.metrics import fitness_table
    from triage_cf.audit.predict import oracle_pair_predictions, pairs_for_metrics
    from triage_cf.audit.subgroups import pair_covariates, subgroup_table
    key = audit_key(dataset, seed, n_records, bias_local, K)
    out = CACHE / f"{key}.json"
    if out.exists():
        return json.loads(out.read_text())
    t0 = memoise_rewrites()
    prm, synth = knobs(dataset, n_records, bias_local)
    work = CACHE / "models" / key
    work.mkdir(parents=True, exist_ok=True)
    with threadpool_limits(1):
        d = build_cohort(dataset, seed, synth, float(prm.get("test_size", 0.5)), prm.get("ft_eval_n"))
        real, nulls, test_pred = rf_and_nulls(d, seed, K, work)
        kn = {k: v for k, v in synth.items() if k != "n_records"}
        oracle = pairs_for_metrics(oracle_pair_predictions(d["pairs"], d["text_fields"], d["levels"], d["lang"], kn), d["ok"], "oracle")
    fitness = fitness_table({"RF": test_pred}, d["levels"], n_boot=n_boot, seed=seed)
    cov = pair_covariates(d["ok"], d["lang"])
    st = subgroup_table(pd.concat([real, oracle]), cov, nulls, fitness, n_boot=n_boot, seed=seed,
                        families=["complaint_category"], metrics=["female_skew"])
    f = fitness.set_index("model").loc["RF"]
    res = dict(version=VERSION, key=key, dataset=dataset, seed=int(seed), n_records=int(n_records), K=int(K),
               bias_local=float(bias_local), bias_local_cc=PLANTED_CC, planted_category=PLANTED_CATEGORY,
               n_cohort=len(d["cohort"]), n_pairs=len(d["ok"]),
               category_share=float((cov.complaint_category == PLANTED_CATEGORY).mean()),
               kappa_w=float(f.kappa_w), fit_for_audit=bool(f.fit_for_audit),
               rf=category_rows(st, "RF"), oracle=category_rows(st, "oracle"), wall_s=round(time.perf_counter() - t0, 1))
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=1))
    tmp.replace(out)
    return res


def audit_summary(a: dict) -> dict:
    "What one audit decided: the planted category flagged with the oracle's sign; flags among the other categories."
    truth = {r["category"]: r["estimate"] for r in a["oracle"]}
    rows = {r["category"]: r for r in a["rf"]}
    p = rows.get(a["planted_category"], {})
    sign_ok = p.get("estimate") is not None and truth.get(a["planted_category"]) is not None and \
        np.sign(p["estimate"] - (p.get("null_median") or 0)) == np.sign(truth[a["planted_category"]])
    others = [r for c, r in rows.items() if c != a["planted_category"] and r["p"] is not None]
    return dict(key=a["key"], dataset=a["dataset"], seed=a["seed"], fit=a["fit_for_audit"],
                planted_flagged=bool(p.get("finding")) and bool(sign_ok), planted_estimate=p.get("estimate"),
                planted_truth=truth.get(a["planted_category"]), planted_mde=p.get("mde"), planted_n_pairs=p.get("n_pairs"),
                other_tested=len(others), other_flagged=sum(bool(r["finding"]) for r in others),
                other_flagged_names=[r["category"] for r in others if r["finding"]])


def _rate(k: int, n: int) -> dict:
    from statsmodels.stats.proportion import proportion_confint
    lo, hi = proportion_confint(k, n, method="beta") if n else (None, None)
    return dict(k=int(k), n=int(n), rate=k / n if n else None, ci=[lo, hi])


def summarise(audits: list[dict]) -> dict:
    from triage_cf.audit.plan import calibration_curve
    per = [audit_summary(a) for a in audits]
    fit = [s for s in per if s["fit"]]
    rows = sorted((r["n_records"], r["mde"]) for r in calibration_curve()
                  if r["model"] == "RF" and r["statistic"] == "argmax" and r["case_mix"] == 1.0)
    b, a0 = np.polyfit(np.log([n for n, _ in rows]), np.log([m for _, m in rows]), 1)
    curve = lambda n: float(np.exp(a0 + b * np.log(n)))
    sizes = {(a["dataset"], a["n_records"]): a["category_share"] for a in audits}
    return dict(audits=per, n_audits=len(per), n_fit=len(fit),
                recovery=_rate(sum(s["planted_flagged"] for s in fit), len(fit)),
                other_false_flags=_rate(sum(s["other_flagged"] for s in fit), sum(s["other_tested"] for s in fit)),
                audits_with_a_false_flag=_rate(sum(s["other_flagged"] > 0 for s in fit), len(fit)),
                size_choice=[dict(dataset=ds, n_records=n, category_share=sh, mde_curve_at_category_size=curve(sh * n))
                             for (ds, n), sh in sorted(sizes.items())])


def cmd_run(a) -> None:
    CACHE.mkdir(parents=True, exist_ok=True)
    for seed in range(a.first_seed, a.first_seed + a.seeds):
        for ds in a.datasets:
            r = run_audit(ds, seed, a.n_records, a.bias_local, a.K, a.n_boot)
            s = audit_summary(r)
            print(f"{r['key']}: fit {r['fit_for_audit']} planted flagged {s['planted_flagged']} "
                  f"(RF {s['planted_estimate']}, oracle {s['planted_truth']}), other flags {s['other_flagged']}/{s['other_tested']} "
                  f"{s['other_flagged_names']} ({r['wall_s']} s)", flush=True)
    cmd_summarise(a)


def cmd_summarise(a) -> None:
    kept = json.loads(RESULT.read_text())["audit_records"] if RESULT.exists() else []
    found = {json.loads(p.read_text())["key"]: json.loads(p.read_text()) for p in sorted(CACHE.glob("v*.json"))} if CACHE.exists() else {}
    records = {r["key"]: r for r in kept} | found
    audits = [records[k] for k in sorted(records)]
    out = dict(benchmark="localised_bias", planted=dict(bias_local_cc=PLANTED_CC, category=PLANTED_CATEGORY),
               generated=time.strftime("%Y-%m-%d %H:%M"), **summarise(audits), audit_records=audits)
    RESULT.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("n_audits", "n_fit", "recovery", "other_false_flags", "audits_with_a_false_flag",
                                          "size_choice")}, indent=1))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--datasets", nargs="+", default=["synth-en", "synth-fr"])
    r.add_argument("--seeds", type=int, default=3)
    r.add_argument("--first-seed", type=int, default=1)
    r.add_argument("--n-records", type=int, default=12000)
    r.add_argument("--bias-local", type=float, default=0.5)
    r.add_argument("--K", type=int, default=9)
    r.add_argument("--n-boot", type=int, default=1000)
    sub.add_parser("summarise")
    a = p.parse_args(argv)
    {"run": cmd_run, "summarise": cmd_summarise}[a.cmd](a)


if __name__ == "__main__":
    main()
