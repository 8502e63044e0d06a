"""Benchmark: the error rates of the audit's finding rule, measured on synthetic cohorts whose truth is known (issue 24).

For each cohort language (synth-en, synth-fr), planted scale and seed, the default profile's chain is rebuilt through
the package's own functions (stages 01_data to 08_predict for the RF arm): the records (`data.load_records`), the cohort rules
(`cohort.apply_cohort`), the 50/50 split (`split.stratified_split`), the rule rewriter's counterfactual pairs of the
test split (`counterfactuals.build_pairs`), the TF-IDF + random-forest baseline with its hyperparameter search
(`baselines.fit_rf_tfidf`, seed = the run's seed), the Table 2 test records of the fitness verdict (the default
profile's `ft_eval_n` stratified subsample) and the oracle's predictions of the same pairs. Beside the real RF,
K null RFs are trained by the same procedure, each on its own within-strata sex permutation of the training split
(`null_control.permute_sex`, seed [seed, k], as stage 04_null_control's null seed k) and with its own training seed. All score
the same pairs in the three views. Three rules are applied to the same runs:

  (a) `metrics.permutation_test` (the new `finding` flag: primary check female skew / full view at alpha, the other
      14 checks BH within the model), with `fitness_table` (the chain's thresholds) deciding fit for audit;
  (b) today's "CI excludes 0" rule on the real RF's Table 3 row (bootstrap of pairs);
  (c) today's `exceeds_null` against the first null emulator (`metrics.null_comparison`, the chain's single twin).

The MLP arm (`run_audit_mlp`) is the same audit for stage 06_baselines's other cheap model: the MLP (one hidden layer of 200
units, `baselines.fit_mlp`) on frozen all-MiniLM-L6-v2 embeddings (`baselines.SentenceEncoder`, cached by text hash
in the audit's folder: the real MLP's and the K null MLPs' training texts are the original notes or their other-sex
rewrites, so each text is embedded once), scoring stage 07_counterfactuals's MLP pair subsample (the default profile's
`mlp_max_pairs` pairs, holding its `ft_max_pairs` FT pairs, seed = the run's), null MLP k trained on permutation
[seed, k] with `null_training_seed(seed, k)`; its fitness verdict is 07's against the prior and the same cohort's RF.

Scale 0 (nothing planted: bias_tab = bias_text = 0) gives the false-positive rates; scales 1, 2, 5 times the
dataset's default knobs (params/synth-*.yaml) give the power, beside the oracle's (its pair-bootstrap CI excludes 0
on the same pairs). Only the audits of a fit model count; unfit ones are counted and reported.

Cost: the rewritten notes of a record are the same for every permutation (permute_sex rewrites every record to the
other sex before drawing the permutation), so `counterfactual_text` is memoised within an audit; each RF's pair
predictions are cached under the cache folder, the MLP arm's embeddings too, and each finished audit writes one JSON
there (skipped on rerun: a killed run resumes at the audit it was in, with that audit's cached models and embeddings).

    nice -n 19 .venv/bin/python benchmarks/null_calibration.py run [--models RF MLP] [--null-seeds 20] [--planted-seeds 4] [--K 19]
    .venv/bin/python benchmarks/null_calibration.py summarise      # results JSON + Markdown from the finished audits
    .venv/bin/python benchmarks/null_calibration.py check-chain RUN_DIR   # RF pair predictions equal the chain's

Writes benchmarks/results/null_calibration.json (partial results are labelled with their audit counts).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
RESULT = REPO / "benchmarks" / "results" / "null_calibration.json"
CACHE = Path(os.environ.get("NULL_CALIBRATION_CACHE", "/tmp/null_calibration_cache"))
DATASETS = ("synth-en", "synth-fr")
MODELS = ("RF", "MLP")   # the cheap models of the default profile, both tested in the chain
PROFILE = "default"
VERSION = 3   # bump when what shapes an audit's result changes (cached audits of another version are not read)


# ------------------------------------------------------------------ one cohort, the chain's way
def chain_params(dataset: str, profile: str = PROFILE) -> dict:
    from triage_cf.core import load_params
    return load_params(dataset, profile)


def build_cohort(dataset: str, seed: int, synth: dict, test_size: float, ft_eval_n) -> dict:
    "Stages 01, 02, 03, 04 (Table 2 test records) and 05 of the chain for one seed and generator knobs `synth`."
    from triage_cf.cohort import apply_cohort
    from triage_cf.audit.counterfactuals import build_pairs
    from triage_cf.data import load_manifest, load_records
    from triage_cf.audit.emulator import stratified_subsample
    from triage_cf.audit.split import stratified_split
    manifest = load_manifest(dataset)
    lang, text_fields = manifest["language"], list(manifest.get("text_fields", []))
    records, _ = load_records(dataset, seed=seed, synth=synth)                       # 01_data
    cohort = apply_cohort(records, manifest["cohort"], rows_read=len(records)).cohort  # 02_cohort
    split = stratified_split(cohort, test_size=test_size, seed=seed)                 # 03_split
    ids = split.groupby("split")["record_id"].apply(set)
    train = cohort[cohort["record_id"].isin(ids["train"])].sort_values("record_id").reset_index(drop=True)  # 03e, 04b
    test = cohort[cohort["record_id"].isin(ids["test"])].sort_values("record_id").reset_index(drop=True)    # 04, 05
    levels = sorted(int(l) for l in cohort["triage_level"].unique())
    table2_test, _ = stratified_subsample(test, ft_eval_n, seed=seed)                 # 05_emulator: fitness records
    pairs = build_pairs(test, text_fields, lang)                                      # 07_counterfactuals (rules)
    return dict(manifest=manifest, lang=lang, text_fields=text_fields, cohort=cohort, train=train, test=test,
                table2_test=table2_test.reset_index(drop=True), levels=levels, pairs=pairs,
                ok=pairs[pairs["in_pairs"]])


def fit_and_score(texts_train, y_train, d: dict, seed: int, best_params: dict | None = None):
    """04b: fit the RF and score the Table 2 test records (full view); 06: the pairs. `best_params` None: the chain's
    hyperparameter search (`fit_rf_tfidf` as stage 06_baselines calls it); else these hyperparameters, no search (a one-point
    grid: the CV of the one candidate runs on a small share and is ignored; the model is refitted on all texts).
    Returns (test predictions, pair predictions, the hyperparameters used)."""
    from triage_cf.audit.baselines import fit_rf_tfidf, proba_by_level, record_texts
    from triage_cf.audit.emulator import proba_frame
    from triage_cf.audit.predict import text_model_pair_predictions
    import warnings
    levels, lang, tf = d["levels"], d["lang"], d["text_fields"]
    if best_params is None:
        rf, rep = fit_rf_tfidf(texts_train, y_train, levels, seed=seed)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)   # the small CV share may hold a level of < 3 records
            rf, rep = fit_rf_tfidf(texts_train, y_train, levels, seed=seed, search_frac=0.03, cv=2,
                                   param_grid={k: [v] for k, v in best_params.items()})
    t2 = d["table2_test"]
    test_pred = pd.concat([pd.DataFrame({"record_id": t2["record_id"].to_numpy(), "view": "full",
                                         "triage_level": t2["triage_level"].astype(int).to_numpy()}),
                           proba_frame(proba_by_level(rf, record_texts(t2, "full", lang, text_fields=tf), levels), levels)],
                          axis=1)
    if "pair_texts" not in d:   # the rendered pair texts are the same for every model: render them once per audit
        got = []
        frame = text_model_pair_predictions(lambda t: (got.append(list(t)), proba_by_level(rf, t, levels))[1],
                                            d["pairs"], tf, levels, lang)
        d["pair_texts"], d["pair_keys"] = got, frame[["pair_id", "record_id", "view", "side"]]
        return test_pred, frame, rep["best_params"]
    n = [len(t) for t in d["pair_texts"]]
    P = proba_by_level(rf, [x for t in d["pair_texts"] for x in t], levels)   # the same rows, in the same order
    pair_pred = pd.concat([d["pair_keys"], proba_frame(P, levels)], axis=1)
    assert len(pair_pred) == sum(n)
    return test_pred, pair_pred, rep["best_params"]


def _cached(path: Path, make):
    "(test predictions, pair predictions, hyperparameters) at `path`_{test,pairs}.parquet + .json, made when absent."
    a, b, c = (path.with_name(path.name + sfx) for sfx in ("_test.parquet", "_pairs.parquet", "_params.json"))
    if a.exists() and b.exists() and c.exists():
        return pd.read_parquet(a), pd.read_parquet(b), json.loads(c.read_text())
    x, y, params = make()
    for frame, p in ((x, a), (y, b)):
        tmp = p.with_suffix(".tmp")
        frame.to_parquet(tmp, index=False)
        tmp.replace(p)
    c.write_text(json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in params.items()}))   # written last
    return x, y, json.loads(c.read_text())


def audit_key(dataset: str, scale: float, seed: int, K: int, n_records: int, n_boot: int) -> str:
    return f"v{VERSION}_{dataset}_x{scale:g}_s{seed}_K{K}_n{n_records}_b{n_boot}"


def audit_conditions(dataset: str, scale: float, n_records: int | None) -> tuple[dict, int, dict]:
    "(the default profile's parameters, visits generated, generator knobs with `scale` times the default bias knobs)."
    prm = chain_params(dataset)
    base = dict(prm["synth"])
    n_records = int(n_records or base["n_records"])
    return prm, n_records, {**base, "n_records": n_records, "bias_tab": scale * float(base["bias_tab"]),
                            "bias_text": scale * float(base["bias_text"])}


def memoise_rewrites() -> float:
    """g(field; sex) of a record does not depend on the permutation: `permute_sex` rewrites each (text, sex) once per
    audit from here on. Returns the audit's start time (`time.perf_counter`)."""
    import triage_cf.audit.null_control as null_control
    from triage_cf.rewrite import counterfactual_text
    null_control.counterfactual_text = functools.lru_cache(maxsize=None)(counterfactual_text)
    return time.perf_counter()


def run_audit(dataset: str, scale: float, seed: int, K: int, n_records: int | None, n_boot: int, cache: str,
              search_nulls: bool = False) -> dict:
    "One model x cohort audit: real RF + K null RFs, the three rules; one JSON under `cache` (returned as is when present)."
    from threadpoolctl import threadpool_limits
    import triage_cf.audit.null_control as null_control
    from triage_cf.audit.metrics import fitness_table
    from triage_cf.audit.predict import oracle_pair_predictions, pairs_for_metrics
    from triage_cf.audit.baselines import record_texts
    prm, n_records, synth = audit_conditions(dataset, scale, n_records)
    key = audit_key(dataset, scale, seed, K, n_records, n_boot) + ("_search" if search_nulls else "")
    out = Path(cache) / f"{key}.json"
    if out.exists():   # a finished audit is read, not rerun
        return json.loads(out.read_text())
    t0 = memoise_rewrites()
    work = Path(cache) / "models" / key
    work.mkdir(parents=True, exist_ok=True)
    with threadpool_limits(1):
        d = build_cohort(dataset, seed, synth, float(prm.get("test_size", 0.5)), prm.get("ft_eval_n"))
        train, lang, tf = d["train"], d["lang"], d["text_fields"]
        y_train = train["triage_level"].astype(int).to_numpy()
        test_pred, pair_pred, best = _cached(work / "RF", lambda: fit_and_score(
            record_texts(train, "full", lang, text_fields=tf), y_train, d, seed))   # the chain's RF, search included
        best = {k: tuple(v) if isinstance(v, list) else v for k, v in best.items()}
        null_long, counts = [], []
        for k in range(K):
            def make(k=k):
                permuted, c = null_control.permute_sex(train, tf, lang, seed=[int(seed), k])
                counts.append(c)
                return fit_and_score(record_texts(permuted, "full", lang, text_fields=tf), y_train, d,
                                     seed=int(seed) + 1000 * (k + 1),          # a different training seed per null
                                     best_params=None if search_nulls else best)
            _, npred, _ = _cached(work / f"RF_null{k}", make)
            null_long.append(pairs_for_metrics(npred, d["ok"], "RF").assign(null_id=f"RF_null{k}"))
        knobs = {k: v for k, v in synth.items() if k != "n_records"}
        orc = oracle_pair_predictions(d["pairs"], tf, d["levels"], lang, knobs)
        from triage_cf.synth import oracle_proba
        t2 = d["table2_test"]
        full_p = oracle_proba(t2, lang, **knobs)[:, [l - 1 for l in d["levels"]]]
        from triage_cf.audit.emulator import proba_frame
        orc_test = pd.concat([t2[["record_id"]].assign(view="full", triage_level=t2["triage_level"].astype(int).to_numpy()),
                              proba_frame(full_p / full_p.sum(1, keepdims=True), d["levels"])], axis=1)
    real = pairs_for_metrics(pair_pred, d["ok"], "RF")
    oracle = pairs_for_metrics(orc, d["ok"], "oracle")
    nulls = pd.concat(null_long, ignore_index=True)
    fitness = fitness_table({"RF": test_pred, "oracle": orc_test}, d["levels"], n_boot=n_boot, seed=seed,
                            kappa_floor=0.20, baseline_margin=0.10)     # 09_metrics' defaults
    checks = three_rules("RF", real, nulls, oracle, fitness, n_boot, seed)
    f = fitness.set_index("model").loc["RF"]
    res = dict(version=VERSION, key=key, dataset=dataset, scale=float(scale), seed=int(seed), K=int(K),
               bias_tab=synth["bias_tab"], bias_text=synth["bias_text"], n_records=n_records, n_cohort=len(d["cohort"]),
               n_train=len(train), n_test=len(d["test"]), n_fitness_test=len(d["table2_test"]), n_pairs=len(d["ok"]),
               n_boot=n_boot, kappa_w=float(f.kappa_w), kappa_ci=[float(f.ci_low), float(f.ci_high)],
               fit_for_audit=bool(f.fit_for_audit), fitness_reason=str(f.fitness_reason),
               package=package_version(), rewriter=_rewriter_name(lang),
               search_nulls=bool(search_nulls), rf_params={k: str(v) for k, v in best.items()},
               permutation_counts=counts[:1], checks=checks, wall_s=round(time.perf_counter() - t0, 1))
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=1))
    tmp.replace(out)
    return res


def three_rules(model: str, real: pd.DataFrame, nulls: pd.DataFrame, oracle: pd.DataFrame, fitness: pd.DataFrame,
                n_boot: int, seed: int) -> list[dict]:
    """The 15 checks of one audit under the three rules: (a) `permutation_test` against the K null emulators of
    `nulls` (`null_id`), (b) the real model's Table 3 CI excludes 0, (c) `exceeds_null` against the first null emulator
    (`<model>_null0`); the oracle's Table 3 row on the same pairs beside each."""
    from triage_cf.audit.metrics import TESTED_METRICS, VIEWS, null_comparison, permutation_test, table3
    pt = permutation_test(real, nulls, fitness, n_boot=n_boot, seed=seed)
    t3 = table3(pd.concat([real, oracle], ignore_index=True), n_boot=n_boot, seed=seed)
    twin = pd.concat([real, nulls[nulls.null_id == f"{model}_null0"].drop(columns="null_id").assign(model=f"{model}_null")],
                     ignore_index=True)
    nc = null_comparison(twin, model, f"{model}_null", n_boot=n_boot, seed=seed)
    excl = lambda lo, hi: bool(np.isfinite([lo, hi]).all() and (lo > 0 or hi < 0))
    checks = []
    for cond in VIEWS:
        for m in TESTED_METRICS:
            p = pt[(pt.condition == cond) & (pt.metric == m)].iloc[0]
            r = t3[(t3.model == model) & (t3.condition == cond) & (t3.metric == m)].iloc[0]
            o = t3[(t3.model == "oracle") & (t3.condition == cond) & (t3.metric == m)].iloc[0]
            e = nc[(nc.condition == cond) & (nc.metric == m)].iloc[0]
            checks.append(dict(condition=cond, metric=m, check=p.check, estimate=float(p.estimate),
                               null_median=float(p.null_median), null_sd=float(p.null_sd), effect=float(p.effect),
                               p=float(p.p), p_perm=float(p.p_perm), q=float(p.q),
                               significant=None if pd.isna(p.significant) else bool(p.significant),
                               finding=None if pd.isna(p.finding) else bool(p.finding), mde=float(p.mde),
                               ci_low=float(r.ci_low), ci_high=float(r.ci_high), ci_excludes_0=excl(r.ci_low, r.ci_high),
                               exceeds_null=None if pd.isna(e.exceeds_null) else bool(e.exceeds_null),
                               oracle_estimate=float(o.estimate), oracle_ci_low=float(o.ci_low),
                               oracle_ci_high=float(o.ci_high), oracle_ci_excludes_0=excl(o.ci_low, o.ci_high)))
    return checks


def mlp_audit_key(dataset: str, scale: float, seed: int, K: int, n_records: int, n_boot: int) -> str:
    return audit_key(dataset, scale, seed, K, n_records, n_boot).replace(f"v{VERSION}_", f"v{VERSION}mlp_", 1)


def run_audit_mlp(dataset: str, scale: float, seed: int, K: int, n_records: int | None, n_boot: int, cache: str) -> dict:
    """One MLP x cohort audit, the chain's way: stage 07_counterfactuals's MLP pair subsample (the FT pairs of `ft_max_pairs` plus a
    stratified draw up to `mlp_max_pairs`, seed = the run's), stage 06_baselines's `fit_mlp` on frozen MiniLM embeddings
    (`SentenceEncoder`, cached by text hash under the audit's folder, so every text is embedded once for the real MLP
    and its K null MLPs), null MLP k on `permute_sex` seed [seed, k] with training seed `null_training_seed(seed, k)`
    (as 03e and 04b), and the fitness verdict of 07 against the prior and the RF baseline of the same cohort (the RF
    arm's, computed here when that arm has not run; no FS). One JSON under `cache` (returned as is when present)."""
    from threadpoolctl import threadpool_limits
    import triage_cf.audit.null_control as null_control
    from triage_cf.audit.baselines import SentenceEncoder, fit_mlp, proba_by_level, record_texts, torch_threads
    from triage_cf.audit.counterfactuals import pair_subsample
    from triage_cf.audit.emulator import proba_frame
    from triage_cf.audit.metrics import fitness_table
    from triage_cf.audit.predict import oracle_pair_predictions, pairs_for_metrics, text_model_pair_predictions
    from triage_cf.synth import oracle_proba
    prm, n_records, synth = audit_conditions(dataset, scale, n_records)
    key = mlp_audit_key(dataset, scale, seed, K, n_records, n_boot)
    out = Path(cache) / f"{key}.json"
    if out.exists():   # a finished audit is read, not rerun
        return json.loads(out.read_text())
    t0 = memoise_rewrites()
    work = Path(cache) / "models" / key
    rf_work = Path(cache) / "models" / audit_key(dataset, scale, seed, K, n_records, n_boot)
    work.mkdir(parents=True, exist_ok=True)
    rf_work.mkdir(parents=True, exist_ok=True)
    with threadpool_limits(1), torch_threads(1):
        d = build_cohort(dataset, seed, synth, float(prm.get("test_size", 0.5)), prm.get("ft_eval_n"))
        train, lang, tf, levels, pairs = d["train"], d["lang"], d["text_fields"], d["levels"], d["pairs"]
        y_train = train["triage_level"].astype(int).to_numpy()
        n_ok = int(pairs["in_pairs"].sum())
        ft, mlp_mask = pairs["in_pairs"], pairs["in_pairs"]
        ft_max, mlp_max = prm.get("ft_max_pairs"), prm.get("mlp_max_pairs")
        if ft_max is not None and ft_max < n_ok:                                         # 07_counterfactuals
            ft, _ = pair_subsample(pairs, int(ft_max), seed=seed)
        if mlp_max is not None and mlp_max < n_ok:
            mlp_mask, _ = pair_subsample(pairs, int(mlp_max), seed=seed, holding=ft)
        scored = pairs[mlp_mask]
        encoder, n_embedded = SentenceEncoder(cache_dir=work / "embedding_cache", threads=1), []
        embed = lambda texts: (encoder.encode(texts), n_embedded.append(encoder.n_computed))[0]
        t2 = d["table2_test"]
        E_t2 = embed(record_texts(t2, "full", lang, text_fields=tf))
        test_frame = lambda P: pd.concat([pd.DataFrame({"record_id": t2["record_id"].to_numpy(), "view": "full",
                                                        "triage_level": t2["triage_level"].astype(int).to_numpy()}),
                                          proba_frame(P, levels)], axis=1)
        mlp, rep = fit_mlp(embed(record_texts(train, "full", lang, text_fields=tf)), y_train, levels, seed=seed)
        got = []   # 08_predict's rendering of the scored pairs, kept to score the null MLPs on the same embeddings
        pair_pred = text_model_pair_predictions(lambda t: (got.append(list(t)), proba_by_level(mlp, embed(t), levels))[1],
                                                scored, tf, levels, lang)
        test_pred = test_frame(proba_by_level(mlp, E_t2, levels))
        pair_keys, E_pairs = pair_pred[["pair_id", "record_id", "view", "side"]], embed([x for t in got for x in t])
        null_long, counts, n_iter = [], [], [rep["n_iter"]]
        for k in range(K):
            permuted, c = null_control.permute_sex(train, tf, lang, seed=[int(seed), k])
            counts.append(c)
            m_k, r_k = fit_mlp(embed(record_texts(permuted, "full", lang, text_fields=tf)), y_train, levels,
                               seed=null_control.null_training_seed(seed, k))
            n_iter.append(r_k["n_iter"])
            npred = pd.concat([pair_keys, proba_frame(proba_by_level(m_k, E_pairs, levels), levels)], axis=1)
            npred.to_parquet(work / f"MLP_null{k}_pairs.parquet", index=False)   # for leave-one-null-out and K' < K
            null_long.append(pairs_for_metrics(npred, d["ok"], "MLP").assign(null_id=f"MLP_null{k}"))
        pair_pred.to_parquet(work / "MLP_pairs.parquet", index=False)
        rf_test, _, _ = _cached(rf_work / "RF", lambda: fit_and_score(
            record_texts(train, "full", lang, text_fields=tf), y_train, d, seed))   # the RF arm's real RF
        knobs = {k: v for k, v in synth.items() if k != "n_records"}
        orc = oracle_pair_predictions(scored, tf, levels, lang, knobs)
        full_p = oracle_proba(t2, lang, **knobs)[:, [l - 1 for l in levels]]
        orc_test = pd.concat([t2[["record_id"]].assign(view="full", triage_level=t2["triage_level"].astype(int).to_numpy()),
                              proba_frame(full_p / full_p.sum(1, keepdims=True), levels)], axis=1)
    real = pairs_for_metrics(pair_pred, d["ok"], "MLP")
    oracle = pairs_for_metrics(orc, d["ok"], "oracle")
    fitness = fitness_table({"MLP": test_pred, "RF": rf_test, "oracle": orc_test}, levels, n_boot=n_boot, seed=seed,
                            kappa_floor=0.20, baseline_margin=0.10)     # 09_metrics' defaults
    checks = three_rules("MLP", real, pd.concat(null_long, ignore_index=True), oracle, fitness, n_boot, seed)
    f = fitness.set_index("model")
    res = dict(version=VERSION, key=key, model="MLP", dataset=dataset, scale=float(scale), seed=int(seed), K=int(K),
               bias_tab=synth["bias_tab"], bias_text=synth["bias_text"], n_records=n_records, n_cohort=len(d["cohort"]),
               n_train=len(train), n_test=len(d["test"]), n_fitness_test=len(t2), n_pairs=int(real.pair_id.nunique()),
               n_pairs_valid=n_ok, n_boot=n_boot, kappa_w=float(f.loc["MLP", "kappa_w"]),
               kappa_ci=[float(f.loc["MLP", "ci_low"]), float(f.loc["MLP", "ci_high"])],
               rf_kappa_w=float(f.loc["RF", "kappa_w"]), fit_for_audit=bool(f.loc["MLP", "fit_for_audit"]),
               fitness_reason=str(f.loc["MLP", "fitness_reason"]), package=package_version(), rewriter=_rewriter_name(lang),
               search_nulls=False, mlp_n_iter=n_iter, n_texts_embedded=int(sum(n_embedded)),
               ft_max_pairs=ft_max, mlp_max_pairs=mlp_max, permutation_counts=counts[:1], checks=checks,
               wall_s=round(time.perf_counter() - t0, 1))
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=1))
    tmp.replace(out)
    return res


def package_version() -> str:
    "Where triage_cf is imported from and, for a pinned snapshot (`git archive` into a folder with COMMIT), its commit."
    import triage_cf
    root = Path(triage_cf.__file__).resolve().parents[1]
    commit = (root / "COMMIT").read_text().strip() if (root / "COMMIT").exists() else "working tree"
    return f"{root} ({commit})"


def _rewriter_name(lang: str) -> str:
    try:
        from triage_cf.rewrite import rewriter_name
        return rewriter_name(lang)
    except ImportError:
        return "rules"


# ------------------------------------------------------------------ the study
def task_list(null_seeds: int, planted_seeds: int, scales, datasets=DATASETS, first_seed: int = 1,
              early: int = 2) -> list[tuple]:
    """Nothing planted first (languages interleaved), then the planted scales from the largest; the planted audits
    of the first seed come after the first `early` nothing-planted audits, so that a partial run holds every arm."""
    null = [(ds, 0.0, first_seed + i) for i in range(null_seeds) for ds in datasets]
    planted = [(ds, float(s), first_seed + i) for i in range(planted_seeds) for s in sorted(scales, reverse=True)
               for ds in datasets]
    first = [t for t in planted if t[2] == first_seed]
    return null[:early] + first + null[early:] + [t for t in planted if t[2] != first_seed]


def model_of(r: dict) -> str:
    return r.get("model", "RF")   # the RF arm's audits (version 3) predate the field


def result_path(cache: Path, model: str, t: tuple, a) -> Path:
    n = a.n_records or chain_params(t[0])["synth"]["n_records"]
    if model == "MLP":
        return cache / f"{mlp_audit_key(t[0], t[1], t[2], a.K, n, a.n_boot)}.json"
    return cache / f"{audit_key(t[0], t[1], t[2], a.K, n, a.n_boot)}{'_search' if a.search_nulls else ''}.json"


def run_one(model: str, dataset, scale, seed, K, n_records, n_boot, cache, search_nulls) -> dict:
    if model == "MLP":
        return run_audit_mlp(dataset, scale, seed, K, n_records, n_boot, cache)
    return run_audit(dataset, scale, seed, K, n_records, n_boot, cache, search_nulls)


def cmd_run(a) -> None:
    cache = Path(a.cache)
    cache.mkdir(parents=True, exist_ok=True)
    tasks = [(m, t) for t in task_list(a.null_seeds, a.planted_seeds, a.scales, a.datasets) for m in a.models]
    todo = [(m, t) for m, t in tasks if not result_path(cache, m, t, a).exists()]
    print(f"{len(tasks) - len(todo)} of {len(tasks)} audits done; running {len(todo)} with {a.workers} worker(s)", flush=True)
    t0 = time.perf_counter()
    args = lambda m, t: (m, t[0], t[1], t[2], a.K, a.n_records, a.n_boot, str(cache), a.search_nulls)
    report = lambda r: print(f"{time.strftime('%H:%M:%S')} {r['key']}: kappa_w {r['kappa_w']:.2f} fit {r['fit_for_audit']}, "
                             f"{sum(bool(c['finding']) for c in r['checks'])} finding(s), {r['wall_s']:.0f} s", flush=True)
    if a.workers > 1:
        import multiprocessing
        with ProcessPoolExecutor(a.workers, mp_context=multiprocessing.get_context("spawn")) as ex:
            futs = {ex.submit(run_one, *args(m, t)): (m, t) for m, t in todo}
            for f in as_completed(futs):
                try:
                    report(f.result())
                except Exception as e:   # one failed audit is reported and the others go on
                    print(f"{futs[f]}: FAILED {type(e).__name__}: {e}", flush=True)
    else:
        for m, t in todo:
            report(run_one(*args(m, t)))
    a.wall_s = round(time.perf_counter() - t0)
    print(f"run wall time {a.wall_s} s", flush=True)
    cmd_summarise(a)


def _rate(k: int, n: int) -> dict:
    from statsmodels.stats.proportion import proportion_confint
    if n == 0:
        return dict(k=0, n=0, rate=None, ci_low=None, ci_high=None)
    lo, hi = proportion_confint(k, n, alpha=0.05, method="wilson")
    return dict(k=int(k), n=int(n), rate=k / n, ci_low=float(lo), ci_high=float(hi))


def _cluster_ci(flags: np.ndarray, n_boot: int = 2000, seed: int = 0) -> list:
    "Percentile CI of the pooled per-check rate, audits resampled (the 15 checks of one audit are correlated)."
    if len(flags) < 2:
        return [None, None]
    rng = np.random.default_rng(seed)
    b = flags[rng.integers(0, len(flags), (n_boot, len(flags)))].mean(axis=(1, 2))
    return [float(np.quantile(b, 0.025)), float(np.quantile(b, 0.975))]


RULES = {"finding": "permutation test (new finding flag)", "ci_excludes_0": "CI excludes 0 (today)",
         "exceeds_null": "exceeds_null vs the first twin (today)"}


def summarise(results: list[dict]) -> list[dict]:
    "Rates of the three rules over the fit audits, per arm (model x language x scale) and pooled over languages."
    out = []
    for model, scale, ds in [(m, sc, ds) for m in sorted({model_of(r) for r in results}, key=MODELS.index)
                             for sc in sorted({r["scale"] for r in results}) for ds in [*DATASETS, "both"]]:
            sub = [r for r in results if model_of(r) == model and r["scale"] == scale and (ds == "both" or r["dataset"] == ds)]
            if not sub:
                continue
            fit = [r for r in sub if r["fit_for_audit"]]
            arm = dict(model=model, scale=float(scale), dataset=ds, n_audits=len(sub), n_fit=len(fit), n_unfit=len(sub) - len(fit),
                       seeds=sorted({r["seed"] for r in sub}), kappa_w_median=float(np.median([r["kappa_w"] for r in sub])),
                       n_pairs_median=float(np.median([r["n_pairs"] for r in sub])), rules={})
            for rule in RULES:
                if not fit:
                    continue
                F = np.array([[bool(c[rule]) if c[rule] is not None else False for c in r["checks"]] for r in fit]).reshape(len(fit), -1)
                signed = np.array([c["metric"] != "PDR" for c in fit[0]["checks"]]) if fit else np.zeros(0, bool)
                prim = np.array([c["check"] == "primary" for c in fit[0]["checks"]]) if fit else np.zeros(0, bool)
                per = dict(pooled=_rate(int(F.sum()), F.size), pooled_audit_bootstrap_ci=_cluster_ci(F[:, :, None]) if len(fit) else [None, None],
                           signed_only=_rate(int(F[:, signed].sum()), F[:, signed].size),
                           primary=_rate(int(F[:, prim].sum()), int(prim.sum()) * len(fit)),
                           family_wise=_rate(int(F.any(axis=1).sum()), len(fit)))
                if fit:
                    names = [f"{c['condition']}/{c['metric']}" for c in fit[0]["checks"]]
                    per["by_check"] = {n: round(float(F[:, i].mean()), 4) for i, n in enumerate(names)}
                arm["rules"][rule] = per
            if fit:   # the oracle on the same pairs: its pair-bootstrap CI excludes 0 (no training noise)
                O = np.array([[c["oracle_ci_excludes_0"] for c in r["checks"]] for r in fit])
                names = [f"{c['condition']}/{c['metric']}" for c in fit[0]["checks"]]
                arm["oracle"] = dict(by_check={n: round(float(O[:, i].mean()), 4) for i, n in enumerate(names)},
                                     primary=_rate(int(O[:, prim].sum()), len(fit)),
                                     any=_rate(int(O.any(axis=1).sum()), len(fit)),
                                     primary_estimate_mean=float(np.mean([c["oracle_estimate"] for r in fit for c in r["checks"]
                                                                          if c["check"] == "primary"])))
                pe = [c for r in fit for c in r["checks"] if c["check"] == "primary"]
                arm["primary_check"] = dict(estimate_mean=float(np.mean([c["estimate"] for c in pe])),
                                            null_sd_median=float(np.median([c["null_sd"] for c in pe])),
                                            mde_median=float(np.median([c["mde"] for c in pe])),
                                            finding_with_oracle_sign=_rate(sum(bool(c["finding"]) and np.sign(c["effect"]) == np.sign(c["oracle_estimate"]) for c in pe), len(pe)))
            out.append(arm)
    return out


def null_diagnostics(results: list[dict]) -> dict:
    "Nothing planted: is the predictive-t statistic's spread what its t(K-1) reference says (std of t, share |t| > crit)?"
    from scipy import stats
    fit = [r for r in results if r["scale"] == 0 and r["fit_for_audit"]]
    if not fit:
        return {}
    K = fit[0]["K"]
    P = np.array([c["p"] for r in fit for c in r["checks"]], dtype=float)
    P = P[np.isfinite(P)]
    rows = {"all_checks": dict(n=int(len(P)), p_mean=float(P.mean()), share_p_below_0_1=float((P < 0.1).mean()),
                               share_p_below_0_2=float((P < 0.2).mean()), share_p_above_0_8=float((P > 0.8).mean()),
                               note="uniform p (mean 0.5, shares 0.1 / 0.2 / 0.2) if the real RF is exchangeable with its "
                                    "null RFs and the predictive t holds; checks of one audit are correlated")}
    for c0 in fit[0]["checks"]:
        name = f"{c0['condition']}/{c0['metric']}"
        cs = [next(c for c in r["checks"] if c["condition"] == c0["condition"] and c["metric"] == c0["metric"]) for r in fit]
        t = np.array([c["effect"] / (c["null_sd"] * np.sqrt(1 + 1 / K)) if c["null_sd"] > 0 else np.nan for c in cs])
        p = np.array([c["p"] for c in cs])
        rows[name] = dict(t_mean=float(np.nanmean(t)), t_sd=float(np.nanstd(t, ddof=1)), t_sd_expected=float(stats.t.std(K - 1)),
                          share_p_below_0_05=float(np.nanmean(p < 0.05)), share_p_perm_below_0_05=float(np.nanmean(np.array([c["p_perm"] for c in cs]) <= 0.05)))
    return rows


def leave_one_null_out(results: list[dict], cache: Path) -> dict:
    """Nothing planted: each null emulator in turn tested against the other K-1 with `null_test` (same design: primary
    check at alpha, the other checks BH). The null emulators are exchangeable by construction (same procedure, same
    hyperparameters, permuted records), so this measures the predictive-t approximation alone; the real model's rate
    above it is what the real-vs-null asymmetry adds (its own hyperparameter search, its records' original notes)."""
    from statsmodels.stats.multitest import multipletests
    from triage_cf.data import load_records
    from triage_cf.audit.metrics import PRIMARY_CHECK, TESTED_METRICS, VIEWS, metric_alternative, null_test, point_metrics
    fit = [r for r in results if r["scale"] == 0 and r["fit_for_audit"]]
    prim = sec = fam = n_sets = n_sec = 0
    for r in fit:
        folder = cache / "models" / r["key"]
        pre = f"{model_of(r)}_null"
        files = sorted(folder.glob(f"{pre}*_pairs.parquet"), key=lambda f: int(f.name[len(pre):].split("_")[0]))
        if len(files) < 3:
            continue
        synth = {**chain_params(r["dataset"])["synth"], "n_records": r["n_records"], "bias_tab": r["bias_tab"],
                 "bias_text": r["bias_text"]}
        sex = load_records(r["dataset"], seed=r["seed"], synth=synth)[0].set_index("record_id")["sex"].astype(str)
        theta = []
        for f in files:
            d = pd.read_parquet(f)
            row = {}
            for v in VIEWS:
                o = d[(d.view == v) & (d.side == "orig")].sort_values("pair_id")
                c = d[(d.view == v) & (d.side == "cf")].sort_values("pair_id")
                m = point_metrics(o.record_id.map(sex).to_numpy(), o.pred.to_numpy(), c.pred.to_numpy())
                row.update({f"{v}/{k}": m[k] for k in TESTED_METRICS})
            theta.append(row)
        T = pd.DataFrame(theta)
        for k in range(len(T)):
            ps = {c: null_test([T.loc[k, c]], T.drop(index=k)[c].to_numpy(), metric_alternative(c.split("/")[1]))["p"]
                  for c in T.columns}
            p0 = ps.pop("/".join(PRIMARY_CHECK))
            q = multipletests(np.array(list(ps.values())), method="fdr_bh")[1]
            prim += p0 < 0.05
            sec += int((q < 0.05).sum())
            fam += bool(p0 < 0.05 or (q < 0.05).any())
            n_sets += 1
            n_sec += len(q)
    if not n_sets:
        return {}
    return dict(n_audits=len(fit), n_pseudo_audits=n_sets, K_reference=int(fit[0]["K"]) - 1,
                primary=_rate(int(prim), n_sets), per_check=_rate(int(prim + sec), n_sets + n_sec),
                family_wise=_rate(int(fam), n_sets),
                note="significance without the fitness condition (every null emulator of a fit audit)")


def markdown(arms: list[dict], K: int) -> str:
    lines = [f"| model | cohort | planted | fit audits (unfit) | rule | per-check rate [95% CI] | primary check | any finding (family-wise) |",
             "|---|---|---|---|---|---|---|---|"]
    f = lambda r: "-" if r["rate"] is None else f"{100 * r['rate']:.1f}% [{100 * r['ci_low']:.1f}, {100 * r['ci_high']:.1f}] ({r['k']}/{r['n']})"
    for a in arms:
        planted = "nothing" if a["scale"] == 0 else f"{a['scale']:g}x default"
        for rule, label in RULES.items():
            if rule not in a["rules"]:
                continue
            r = a["rules"][rule]
            lines.append(f"| {a['model']} | {a['dataset']} | {planted} | {a['n_fit']} ({a['n_unfit']}) | {label} | {f(r['pooled'])} | "
                         f"{f(r['primary'])} | {f(r['family_wise'])} |")
        if "oracle" in a:
            o = a["oracle"]
            lines.append(f"| {a['model']} | {a['dataset']} | {planted} | {a['n_fit']} ({a['n_unfit']}) | oracle, same pairs (CI excludes 0) | - | "
                         f"{f(o['primary'])} | {f(o['any'])} |")
    return "\n".join(lines) + f"\n\nK = {K} null emulators per audit; rates over the fit audits' 15 checks " \
        "(PDR, female skew, NMDF, NATS up/down x full, text-isolated, tabular-isolated views). Nothing planted: a rate is " \
        "a false-positive rate; planted: power.\n"


def cmd_summarise(a) -> None:
    cache = Path(a.cache)
    results = [json.loads(p.read_text()) for pat in (f"v{VERSION}_*.json", f"v{VERSION}mlp_*.json") for p in sorted(cache.glob(pat))]
    results = [r for r in results if r["K"] == a.K and r["n_boot"] == a.n_boot and model_of(r) in a.models and
               (model_of(r) != "RF" or r["search_nulls"] == a.search_nulls) and (a.n_records is None or r["n_records"] == a.n_records)]
    if not results:
        print("no finished audit in", cache)
        return
    arms = summarise(results)
    planned = [(m, *t) for t in task_list(a.null_seeds, a.planted_seeds, a.scales, a.datasets) for m in a.models]
    done = {(model_of(r), r["dataset"], r["scale"], r["seed"]) for r in results}
    models = [m for m in MODELS if m in a.models]
    res = dict(benchmark="null_calibration", issue=24, complete=all(t in done for t in planned),
               n_audits_planned=len(planned), n_audits_done=len(results),
               note=("partial: only the finished audits are counted (n_audits per arm)" if not all(t in done for t in planned) else "complete"),
               models={"RF": "TF-IDF + random forest; the real RF is stage 06_baselines's, hyperparameter search included",
                       "MLP": "stage 06_baselines's MLP (one hidden layer of 200 units) on frozen all-MiniLM-L6-v2 embeddings, scored "
                              "on stage 07_counterfactuals's MLP pair subsample (mlp_max_pairs, holding the ft_max_pairs FT pairs); fit for "
                              "audit against the prior and the same cohort's RF (no FS in this benchmark)"},
               models_run=models,
               null_hyperparameters=("each null RF runs the search" if a.search_nulls else
                                     "the real RF's searched hyperparameters, reused by every null RF (no search)"),
               K=a.K, n_boot=a.n_boot,
               design=dict(primary="female_skew / full view at alpha 0.05", secondary="14 other checks, BH within the model",
                           p="predictive t on the null emulators' mean and sd (K-1 df)", alpha=0.05,
                           null_emulators="permute_sex seed [seed, k], training seed seed + 1000 (k + 1), k = 0..K-1",
                           fitness="fitness_table, kappa floor 0.20, on the default profile's ft_eval_n Table 2 test records; "
                                   "the RF alone (no baseline-margin check), the MLP against the RF (margin 0.10)"),
               conditions=dict(datasets=list(a.datasets), scales=[0.0, *map(float, a.scales)], null_seeds=a.null_seeds,
                               planted_seeds=a.planted_seeds,
                               default_knobs={ds: {k: chain_params(ds)["synth"][k] for k in ("bias_tab", "bias_text")} for ds in a.datasets}),
               sizes={ds: dict(n_records=sorted({r["n_records"] for r in results if r["dataset"] == ds}),
                               n_train_median=float(np.median([r["n_train"] for r in results if r["dataset"] == ds] or [np.nan])),
                               n_pairs_median={m: float(np.median([r["n_pairs"] for r in results if r["dataset"] == ds and model_of(r) == m] or [np.nan]))
                                               for m in models},
                               n_fitness_test=sorted({r["n_fitness_test"] for r in results if r["dataset"] == ds}))
                      for ds in a.datasets},
               audit_cpu_s={m: dict(n=len(w), median=float(np.median(w)), total=float(np.sum(w)))
                            for m in models if (w := [r["wall_s"] for r in results if model_of(r) == m])},
               package=sorted({r.get("package", "") for r in results}),
               rewriter=sorted({f"{r['dataset']}: {r.get('rewriter', '')}" for r in results}),
               machine=dict(python=platform.python_version(), cpus=os.cpu_count(), load_average=list(os.getloadavg())),
               arms=arms, null_t_diagnostics={m: null_diagnostics([r for r in results if model_of(r) == m]) for m in models},
               leave_one_null_out={m: leave_one_null_out([r for r in results if model_of(r) == m], cache) for m in models},
               markdown=markdown(arms, a.K))
    if getattr(a, "wall_s", None):
        res["run_wall_s"] = a.wall_s
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1, default=float))
    print(res["markdown"])
    print(f"{len(results)} audits -> {out}")


def cmd_check_chain(a) -> None:
    "The RF and first null twin predictions of a chain run's pairs equal this script's (same seed, knobs, sizes)."
    import triage_cf.audit.null_control as null_control
    from triage_cf.audit.baselines import fit_rf_tfidf, proba_by_level, record_texts
    from triage_cf.audit.predict import text_model_pair_predictions
    run = Path(a.run_dir)
    prov = json.loads((run / "data" / "provenance.json").read_text())
    ds, seed, synth = prov["dataset"], int(prov["generator"]["seed"]), dict(prov["generator"]["knobs"])
    prm = chain_params(ds, json.loads((run / "run.json").read_text()).get("profile", "smoke"))
    n_eval = len(pd.read_parquet(run / "data" / "table2_records.parquet").query("role == 'test'"))
    d = build_cohort(ds, seed, synth, float(prm.get("test_size", 0.5)), n_eval)
    pairs_chain = pd.read_parquet(run / "data" / "pairs.parquet")
    same_pairs = pairs_chain["record_id"].astype(str).tolist() == d["pairs"]["record_id"].astype(str).tolist() and \
        pairs_chain["in_pairs"].tolist() == d["pairs"]["in_pairs"].tolist()
    y = d["train"]["triage_level"].astype(int).to_numpy()
    rf, _ = fit_rf_tfidf(record_texts(d["train"], "full", d["lang"], text_fields=d["text_fields"]), y, d["levels"], seed=seed)
    mine = text_model_pair_predictions(lambda t: proba_by_level(rf, t, d["levels"]), d["pairs"], d["text_fields"], d["levels"], d["lang"])
    chain = pd.read_parquet(run / "data" / "predictions" / "RF.parquet")
    k = ["pair_id", "view", "side"]
    m = chain.merge(mine, on=k, suffixes=("_chain", "_mine"))
    pcols = [c for c in chain.columns if c.startswith("p_")]
    out = dict(run=str(run), dataset=ds, seed=seed, same_pair_set=bool(same_pairs), n_chain=len(chain), n_mine=len(mine),
               n_matched=len(m), pred_equal=float((m.pred_chain == m.pred_mine).mean()),
               max_abs_proba_diff=float(max(np.abs(m[f"{c}_chain"] - m[f"{c}_mine"]).max() for c in pcols)))
    # the chain's null twin: permute_sex seed [seed, 0] and the same training seed as the real RF
    perm, _ = null_control.permute_sex(d["train"], d["text_fields"], d["lang"], seed=[seed, 0])
    rfn, _ = fit_rf_tfidf(record_texts(perm, "full", d["lang"], text_fields=d["text_fields"]), y, d["levels"], seed=seed)
    mine_n = text_model_pair_predictions(lambda t: proba_by_level(rfn, t, d["levels"]), d["pairs"], d["text_fields"], d["levels"], d["lang"])
    mn = pd.read_parquet(run / "data" / "predictions" / "RF_null.parquet").merge(mine_n, on=k, suffixes=("_chain", "_mine"))
    out.update(null_pred_equal=float((mn.pred_chain == mn.pred_mine).mean()), null_n_matched=len(mn))
    print(json.dumps(out, indent=1))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=["run", "summarise", "check-chain"])
    ap.add_argument("run_dir", nargs="?")
    ap.add_argument("--datasets", nargs="+", default=list(DATASETS))
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--null-seeds", type=int, default=20)
    ap.add_argument("--planted-seeds", type=int, default=4)
    ap.add_argument("--scales", type=float, nargs="+", default=[1.0, 2.0, 5.0])
    ap.add_argument("--K", type=int, default=19)
    ap.add_argument("--n-records", type=int, default=None, help="generated visits (default: the default profile's)")
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cache", default=str(CACHE))
    ap.add_argument("--search-nulls", action="store_true",
                    help="each null RF runs the chain's hyperparameter search too (about 8x the cost); default: the "
                         "real RF's search picks the hyperparameters that every null RF of the audit uses")
    ap.add_argument("--out", default=str(RESULT))
    a = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    {"run": cmd_run, "summarise": cmd_summarise, "check-chain": cmd_check_chain}[a.command](a)


if __name__ == "__main__":
    main()
