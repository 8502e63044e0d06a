"""Benchmark: the audit's level and power against cohort size, case mix by sex and planted effect (issue 37).

One *audit* = one synthetic cohort (language, `n_records`, `case_mix_by_sex`, planted scale, seed) taken through the
chain's own functions, as the default profile does, with the audit design of this release:

  01-03  records (`data.load_records`), cohort rules (`cohort.apply_cohort`), the 50/50 split;
  04     null sexes (`null_control.null_design`): the conditional permutation (Berrett et al.) with a propensity that
         reads the tabular case mix and the sex-neutral notes (`--propensity notes`, the default; `tabular`: the
         tabular case mix only; `notes-all`: q-hat learnt from the test split's records too; `generator`: the
         synthetic cohort's own, no q-hat), records holding a sex-marked
         word g leaves kept at their sex (`--marked`), or the uniform shuffle (`--null uniform`); K copies for the
         null emulators + one tuning copy; g rewrites every re-sexed record's notes (`--normalise`: every note in
         g's own rendering, an ablation);
  06     the RF (TF-IDF + random forest): hyperparameters searched once on the tuning copy (`fit_rf_tfidf`, search capped
         at 4,000 records), the real RF and the K null RFs trained with them, each null with its own training seed
         (or the real one: `--shared-seed`); `--models RF MLP` adds the MLP on frozen MiniLM embeddings (`fit_mlp`,
         `SentenceEncoder`) trained on the same texts, scoring every pair;
  07-08  the rule rewriter's counterfactual pairs of the test split (`counterfactuals.build_pairs`), scored by every
         model and by the oracle in the three views;
  09     `metrics.permutation_test` (the argmax checks: primary = female skew / full view, 14 secondary checks with BH)
         with `fitness_table` (the fitness verdict on `--fitness-n` test records), and the expected-level statistic
         `NMDF_expected` (`metrics.nmdf_expected`) tested against the same null emulators (`metrics.null_test`).

Scale 0 (nothing planted: bias_tab = bias_text = 0) gives the false-positive rates; scales 1, 2, 5 times the
dataset's default knobs (params/synth-*.yaml) the power. The oracle's estimates on the same pairs are the truth
(its argmax and expected-level metrics; attenuation = emulator estimate / oracle estimate).

Each finished audit writes one JSON under the cache (skipped on rerun), with every emulator's female skew, PDR and
NMDF per view (`emulator_values`: the test's own calibration, `t_calibration`; `backfill` adds them to older audits),
and each model's pair predictions are cached, so a killed run resumes where it was. `summarise` pools the audits into
benchmarks/results/calibration_scale.json (+ figure), one cell per model x design x dataset x size x case mix x planted
scale, labelled with what they cover.

    nice -n 10 .venv/bin/python benchmarks/calibration_scale.py run --datasets synth-fr synth-en --sizes 3000 12000 \
        --case-mix 0 1 2 --scales 0 --seeds 6 --K 9
    .venv/bin/python benchmarks/calibration_scale.py summarise
    .venv/bin/python benchmarks/calibration_scale.py missing     # what issue 37's grid still wants, in CPU-hours
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
RESULT = REPO / "benchmarks" / "results" / "calibration_scale.json"
FIGURE = REPO / "benchmarks" / "results" / "calibration_scale.png"
#: every finished audit's JSON, committed (gzip JSON lines): the cache under /tmp does not outlive a machine
RECORDS = REPO / "benchmarks" / "results" / "calibration_scale_audits.jsonl.gz"
CACHE = Path(os.environ.get("CALIBRATION_SCALE_CACHE", "/tmp/calibration_scale_cache"))
VERSION = 1   # bump when what shapes an audit's result changes
SOFT = "NMDF_expected"


def audit_key(a: dict) -> str:
    return ("v{v}_{dataset}_n{n_records}_c{case_mix:g}_x{scale:g}_s{seed}_K{K}_{null}{shared}{q}{norm}"
            .format(v=VERSION, shared="_shared" if a["shared_seed"] else "", norm=("_norm" if a.get("normalise") else "") + {True: "_mk", "both": "_mk2"}.get(a.get("marked"), "")
                    + ("_mlp" if "MLP" in a.get("models", ["RF"]) else "")
                    + (f"_ms{a['rf_max_samples']}" if a.get("rf_max_samples") else "")
                    + ("_pseudo" if a.get("pseudo_real") else ""),
                    q={"notes": "_qnotes", "notes-all": "_qnotesall", "tabular": "_qtab", "generator": "_qgen"}.get(a.get("propensity"), ""), **a))   # none: q in-sample (v1's first)


def synth_knobs(dataset: str, n_records: int, case_mix: float, scale: float) -> dict:
    "The default profile's generator knobs with the bias knobs scaled and the case mix set."
    from triage_cf.core import load_params
    base = dict(load_params(dataset, "default")["synth"])
    return {**base, "n_records": int(n_records), "case_mix_by_sex": float(case_mix),
            "bias_tab": scale * float(base["bias_tab"]), "bias_text": scale * float(base["bias_text"])}


def cohort(a: dict, fitness_n: int) -> dict:
    "Stages 01-03 and the pairs of stage 07 for one audit (the chain's functions)."
    from null_calibration import build_cohort
    return build_cohort(a["dataset"], a["seed"], synth_knobs(a["dataset"], a["n_records"], a["case_mix"], a["scale"]),
                        0.5, fitness_n)


def _cached_frame(path: Path, make) -> pd.DataFrame:
    if path.exists():
        return pd.read_parquet(path)
    df = make()
    tmp = path.with_suffix(".tmp")
    df.to_parquet(tmp, index=False)
    tmp.replace(path)
    return df


def round_trip(records: pd.DataFrame, tf: list[str], lang: str, rewrites: dict, ok: np.ndarray) -> pd.DataFrame:
    """`records` with the text fields of the `ok` rows replaced by g(g(note; other sex); own sex): every note in g's own
    rendering of its sex, so that the real emulator, its nulls and both sides of a pair read notes written one way."""
    from triage_cf.rewrite import counterfactual_texts
    out, idx = records.copy(), np.flatnonzero(ok)
    own = records["sex"].astype(str).to_numpy()[idx].tolist()
    for f in tf:
        back = counterfactual_texts([rewrites[f][i].text for i in idx], own, lang)
        col = out[f].astype(object).to_numpy().copy()
        for i, r in zip(idx, back):
            col[i] = r.text if r.status in ("ok", "missing") else col[i]
        out[f] = pd.array(col, dtype=records[f].dtype)
    return out


def normalise_pairs(d: dict) -> None:
    "The pairs' original side in g's rendering (`round_trip` of the cf side), in place: both sides written by g."
    from triage_cf.rewrite import RewriteResult
    p, tf, lang = d["pairs"], d["text_fields"], d["lang"]
    ok = p["in_pairs"].to_numpy()
    rw = {f: [RewriteResult(text=None if pd.isna(v) else v, status="ok", reason="") for v in p[f"cf_{f}"]] for f in tf}
    d["pairs"] = round_trip(p, tf, lang, rw, ok)
    d["ok"] = d["pairs"][d["pairs"]["in_pairs"]]


def generator_propensity(train: pd.DataFrame, a: dict) -> np.ndarray:
    """The synthetic cohort's own P(S = F | x) per training record, from its generator (`--propensity generator`):
    the prior, the age densities by sex (`_age_by_sex`), the complaint weights by sex (`class_weights`; a complaint
    only one sex can have gives that sex) and the systolic pressure's shift given age and the latent severity h (read
    from the generator's draws of the same seed), the terms that make sex depend on the case mix; every other draw is
    independent of sex. A valid propensity for the conditional permutation (the nurses' level depends on the recorded
    x only), which q-hat estimates."""
    from scipy.stats import beta
    from triage_cf import synth
    lang = "fr" if a["dataset"] == "synth-fr" else "en"
    knobs = synth_knobs(a["dataset"], a["n_records"], a["case_mix"], a["scale"])
    knobs = {k: v for k, v in knobs.items() if k != "n_records"}
    kn, cm = synth._knobs(lang, knobs), float(a["case_mix"])
    blocks = [synth._draws(lang, a["seed"], b, kn) for b in range(-(-int(a["n_records"]) // synth._BLOCK))]
    idx = train["record_id"].astype("int64").to_numpy() - (10_000_001 if lang == "fr" else 30_000_001)
    get = lambda k: np.concatenate([b[k] for b in blocks])[idx]
    sex, age, cc, h = get("sex"), get("age"), get("cc"), get("h")
    if (sex != train["sex"].astype(str).to_numpy()).any():
        raise ValueError("generator_propensity: the generator's draws do not match the records (seed or knobs differ)")
    sf, gap = kn["share_female"], synth.CASE_MIX_BY_SEX["age_gap"] * cm
    def log_p_age(mean):             # P(floor(age) = a | sex): the Beta of `_adult_age` over [a, a + 1)
        m, v = (mean - 18) / 87, (kn["age_sd"] / 87) ** 2
        k = m * (1 - m) / v - 1
        cdf = lambda x: beta.cdf(np.clip((x - 18) / 87, 0, 1), m * k, (1 - m) * k)
        return np.log(np.maximum(cdf(age + 1) - cdf(age), 1e-300))
    logit = np.log(sf / (1 - sf)) + np.where(age >= 18, log_p_age(kn["age_mean"] + gap * (1 - sf))
                                             - log_p_age(kn["age_mean"] - gap * sf), 0.0)   # minors: age by sex alike
    cls = synth.CC_CLASSES
    gen = (cls.group == "genital").to_numpy()
    for sx, sign in (("F", 1.0), ("M", -1.0)):   # P(class | sex, sex-specific or not), as `_pick_class` draws it
        w = synth.class_weights(lang, sx, cm)
        allowed = (cls.sex.isna() | (cls.sex == sx)).to_numpy()
        p = np.zeros(len(w))
        for part in (gen, ~gen):
            p[part & allowed] = w[part & allowed] / w[part & allowed].sum()
        logit = logit + sign * np.log(np.maximum(pd.Series(p, index=cls.code.to_numpy()).reindex(cc).to_numpy(), 1e-300))
    load = np.array([synth._GROUP_LOAD.get(g, synth._LOAD_OTHER)[2] for g in cls.set_index("code").loc[cc].group])
    r = train["sbp"].astype(float).to_numpy() - (128 + 0.3 * (age - 50) + load * np.maximum(h, 0))
    shift = synth.CASE_MIX_BY_SEX["sbp_female"] * cm                          # N(shift, 16^2) against N(0, 16^2)
    logit = logit + np.where(np.isnan(r), 0.0, (r ** 2 - (r - shift) ** 2) / (2 * 16.0 ** 2))
    return np.clip(1 / (1 + np.exp(-logit)), 1e-6, 1 - 1e-6)


def null_design_of(train: pd.DataFrame, test: pd.DataFrame, tf: list, lang: str, a: dict, known) -> tuple[list, dict]:
    """Stage 04's `null_design` for the audit's design: with `notes-all`, q-hat learns from the test split's records too
    (`movable`: only the training records are re-sexed), the outputs cut back to the training records."""
    from triage_cf.audit.null_control import null_design
    kw = dict(method=a["null"], notes=a["propensity"] in ("notes", "notes-all"), fix_marked=bool(a.get("marked")),
              propensity=known)
    if a["propensity"] != "notes-all":
        return null_design(train, tf, lang, a["K"] + 1, a["seed"], **kw)
    n, both = len(train), pd.concat([train, test], ignore_index=True)
    sexes, design = null_design(both, tf, lang, a["K"] + 1, a["seed"], movable=np.arange(len(both)) < n, **kw)
    design = {k: (v[:n] if isinstance(v, np.ndarray) else v) for k, v in design.items()}
    design["rewrites"] = {f: r[:n] for f, r in design["rewrites"].items()}
    return [s[:n] for s in sexes], design


def q_generator_corr(q: np.ndarray, q_true: np.ndarray) -> float | None:
    "The correlation of q-hat's logits with the true propensity's (None where the truth is one value: no case mix)."
    lo = lambda p: np.log(p / (1 - p))
    return float(np.corrcoef(lo(q), lo(q_true))[0, 1]) if np.ptp(lo(q_true)) > 1e-9 and np.ptp(lo(q)) > 0 else None


def null_training_sets(d: dict, a: dict, timing: dict) -> tuple[list[list[str]], list[str], dict]:
    "(training texts of the K null copies, of the tuning copy, diagnostics): stage 04's draws (`null_design`)."
    from triage_cf.audit.baselines import record_texts
    from triage_cf.audit.null_control import null_design, permute_sex, sex_case_mix_auc
    t = time.perf_counter()
    train, lang, tf = d["train"], d["lang"], d["text_fields"]
    if a.get("pseudo_real"):   # the check of the procedure: "real" = one conditional draw from the real records
        s_star, dz = null_design(train, tf, lang, 1, a["seed"] + 7777, notes=a["propensity"] == "notes",
                                 fix_marked=bool(a.get("marked")))
        train = permute_sex(train, tf, lang, rewrites=dz["rewrites"], new_sex=s_star[0])[0]
    known = generator_propensity(train, a) if a["propensity"] == "generator" else None
    sexes, design = null_design_of(train, d["test"], tf, lang, a, known)
    eligible, q, rewrites = design["eligible"], design["q"], design["rewrites"]
    base = round_trip(train, tf, lang, rewrites, eligible | design["marked"]) if a.get("normalise") else train
    texts = [record_texts(permute_sex(base, tf, lang, rewrites=rewrites, new_sex=s)[0], "full", lang, text_fields=tf)
             for s in sexes]
    d["real_texts"] = record_texts(base, "full", lang, text_fields=tf)
    auc = [sex_case_mix_auc(np.asarray(s, dtype=object)[eligible], q[eligible]) for s in sexes]
    timing["null_sexes_s"] = round(time.perf_counter() - t, 1)
    diag = dict(n_eligible=int(eligible.sum()), n_marked=int(design["marked"].sum()), marked_terms=design["terms"],
                auc_before=sex_case_mix_auc(train["sex"].astype(str).to_numpy()[eligible], q[eligible]),
                auc_after_mean=float(np.mean(auc)), sex_level_assoc=sex_level_assoc(train, eligible, sexes[:-1]))
    if not a.get("pseudo_real"):   # how close q-hat is to the cohort's own propensity (logits' correlation, re-sexable)
        diag["q_generator_logit_corr"] = q_generator_corr(q[eligible], generator_propensity(train, a)[eligible])
    return texts[:-1], texts[-1], diag


def sex_level_assoc(train: pd.DataFrame, eligible: np.ndarray, sexes: list) -> dict:
    """The conditional permutation test's raw statistic, no emulator: the women's minus the men's mean triage level
    among the re-sexable records, for the real sexes and each null copy's (exchangeable under H0 if q-hat is right)."""
    y = train["triage_level"].astype(int).to_numpy()
    gap = lambda s: float(y[eligible & (s == "F")].mean() - y[eligible & (s == "M")].mean())
    return dict(real=gap(train["sex"].astype(str).to_numpy()), nulls=[gap(np.asarray(s, dtype=object)) for s in sexes])


def render_pair_texts(d: dict) -> None:
    "The texts of every pair in the three views (`d['pair_texts']`, keys `d['pair_keys']`): the same for every model."
    from triage_cf.audit.predict import text_model_pair_predictions
    if "pair_texts" not in d:
        got, levels = [], d["levels"]
        frame = text_model_pair_predictions(lambda t: (got.append(list(t)), np.zeros((len(t), len(levels))))[1],
                                            d["pairs"], d["text_fields"], levels, d["lang"])
        d["pair_texts"], d["pair_keys"] = [x for t in got for x in t], frame[["pair_id", "record_id", "view", "side"]]


def score_pairs(model, d: dict, levels) -> pd.DataFrame:
    "Pair predictions of one RF in the three views."
    from triage_cf.audit.baselines import proba_by_level
    from triage_cf.audit.emulator import proba_frame
    render_pair_texts(d)
    return pd.concat([d["pair_keys"], proba_frame(proba_by_level(model, d["pair_texts"], levels), levels)], axis=1)


def with_expected(pred: pd.DataFrame, d: dict, name: str, levels) -> pd.DataFrame:
    "`pairs_for_metrics` with each side's expected level (`exp_orig`, `exp_cf`)."
    from triage_cf.audit.metrics import expected_level
    from triage_cf.audit.predict import pairs_for_metrics
    long = pairs_for_metrics(pred, d["ok"], name)
    e = pred.assign(e=expected_level(pred[[f"p_{l}" for l in levels]].to_numpy(), levels)).set_index(["view", "pair_id", "side"])["e"]
    idx = list(zip(long.condition, long.pair_id))
    long["exp_orig"] = e.reindex([(v, p, "orig") for v, p in idx]).to_numpy()
    long["exp_cf"] = e.reindex([(v, p, "cf") for v, p in idx]).to_numpy()
    return long


def soft_checks(real: pd.DataFrame, nulls: pd.DataFrame, oracle: pd.DataFrame, fit: bool, alpha: float = 0.05) -> list:
    "`NMDF_expected` per view of the real RF against its K null RFs (`null_test`), with the oracle's value."
    from triage_cf.audit.metrics import nmdf_expected, null_test
    stat = lambda g: nmdf_expected(g.orig_sex, g.exp_orig, g.exp_cf)
    rows = []
    for cond in ("full", "text_iso", "tab_iso"):
        r, o = real[real.condition == cond], oracle[oracle.condition == cond]
        nv = [stat(g) for _, g in nulls[nulls.condition == cond].groupby("null_id")]
        t = null_test([stat(r)], nv, "two-sided", alpha)
        rows.append(dict(condition=cond, metric=SOFT, estimate=float(t["estimate"]), null_mean=float(t["null_mean"]),
                         null_sd=float(t["null_sd"]), effect=float(t["effect"]), p=float(t["p"]), mde=float(t["mde"]),
                         significant=bool(t["p"] < alpha), finding=bool(fit and t["p"] < alpha),
                         oracle_estimate=float(stat(o))))
    return rows


def mlp_arm(d: dict, a: dict, null_texts: list[list[str]], y: np.ndarray, work: Path, levels, timing: dict) -> dict:
    """The MLP (stage 06's `fit_mlp` on frozen MiniLM embeddings, `SentenceEncoder`, cached by text hash under the
    cache): the real MLP and its K nulls trained on the same texts as the RFs, scoring every pair (no `mlp_max_pairs`
    cap: the embeddings of a pair's texts are shared by all K + 1 models, so scoring them all costs one encoding)."""
    from triage_cf.audit.baselines import SentenceEncoder, fit_mlp, proba_by_level, record_texts
    from triage_cf.audit.emulator import proba_frame
    t = time.perf_counter()
    enc = SentenceEncoder(cache_dir=CACHE / "embeddings", threads=1)
    e_pairs = enc.encode(d["pair_texts"])
    t2 = d["table2_test"]
    e_test = enc.encode(record_texts(t2, "full", d["lang"], text_fields=d["text_fields"]))
    preds, fits = {}, []
    for k, texts in [("real", d["real_texts"])] + list(enumerate(null_texts)):
        t1 = time.perf_counter()
        seed_k = a["seed"] if (k == "real" or a["shared_seed"]) else a["seed"] + 1000 * (k + 1)
        def make(texts=texts, seed_k=seed_k, k=k):
            mlp, _ = fit_mlp(enc.encode(texts), y, levels, seed=seed_k)
            if k == "real":
                pd.concat([t2[["record_id"]].assign(view="full", triage_level=t2["triage_level"].astype(int).to_numpy()),
                           proba_frame(proba_by_level(mlp, e_test, levels), levels)], axis=1).to_parquet(
                    work / "mlp_real_test.parquet", index=False)
            return pd.concat([d["pair_keys"], proba_frame(proba_by_level(mlp, e_pairs, levels), levels)], axis=1)
        preds[k] = _cached_frame(work / f"mlp_pairs_{k}.parquet", make)
        fits.append(round(time.perf_counter() - t1, 1))
    timing["mlp_s"] = round(time.perf_counter() - t, 1)
    timing["mlp_fit_score_s"] = fits
    return preds


def evaluate_arm(name: str, preds: dict, real_test: pd.DataFrame, d: dict, a: dict, oracle: pd.DataFrame,
                 orc_test: pd.DataFrame, n_boot: int) -> dict:
    "One model's checks against its K nulls: fitness, the argmax checks (`permutation_test`) and `NMDF_expected`."
    from triage_cf.audit.metrics import fitness_table, permutation_test, point_metrics
    levels = d["levels"]
    real = with_expected(preds["real"], d, name, levels)
    nulls = pd.concat([with_expected(preds[k], d, name, levels).assign(null_id=f"{name}_null{k}") for k in range(a["K"])],
                      ignore_index=True)
    fitness = fitness_table({name: real_test, "oracle": orc_test}, levels, n_boot=n_boot, seed=a["seed"],
                            kappa_floor=0.20, baseline_margin=0.10)
    f = fitness.set_index("model").loc[name]
    fit = bool(f["fit_for_audit"])
    cols = ["orig_sex", "pred_orig", "pred_cf", "pair_id", "condition", "true_level", "model"]
    pt = permutation_test(real[cols], nulls[cols + ["null_id"]], fitness, n_boot=n_boot, seed=a["seed"])
    orc_m = {c: point_metrics(g.orig_sex, g.pred_orig, g.pred_cf) for c, g in oracle.groupby("condition")}
    checks = [dict(condition=r.condition, metric=r.metric, check=r.check, estimate=float(r.estimate),
                   null_sd=float(r.null_sd), effect=float(r.effect), p=float(r.p), q=float(r.q),
                   significant=None if pd.isna(r.significant) else bool(r.significant),
                   finding=None if pd.isna(r.finding) else bool(r.finding), mde=float(r.mde),
                   oracle_estimate=float(orc_m[r.condition][r.metric])) for r in pt.itertuples()]
    return dict(kappa_w=float(f.kappa_w), fit_for_audit=fit, checks=checks,
                soft_checks=soft_checks(real, nulls, oracle, fit), emulator_values=emulator_values(real, nulls))


#: the metrics whose value per emulator an audit keeps (`emulator_values`): the primary's and two secondaries'
KEPT_METRICS = ("female_skew", "PDR", "NMDF")


def emulator_values(real: pd.DataFrame, nulls: pd.DataFrame) -> dict:
    """{view: {metric: {"real": value, "nulls": [K values]}}} of `KEPT_METRICS`: what the calibration of the test itself
    needs (each null against the others: `loo_t`)."""
    from triage_cf.audit.metrics import point_metrics
    pm = lambda g: point_metrics(g.orig_sex, g.pred_orig, g.pred_cf)
    out = {}
    for cond in ("full", "text_iso", "tab_iso"):
        r = pm(real[real.condition == cond])
        nv = [pm(g) for _, g in nulls[nulls.condition == cond].groupby("null_id", sort=True)]
        out[cond] = {m: {"real": float(r[m]), "nulls": [float(v[m]) for v in nv]} for m in KEPT_METRICS}
    return out


def run_audit(a: dict, fitness_n: int, n_boot: int) -> dict:
    "One audit (see the module's docstring); its JSON under the cache, returned as is when present."
    from threadpoolctl import threadpool_limits
    from triage_cf.audit.baselines import fit_rf_tfidf, proba_by_level, record_texts
    from triage_cf.audit.emulator import proba_frame
    from triage_cf.audit.predict import oracle_pair_predictions
    from triage_cf.synth import oracle_proba
    key = audit_key(a)
    out = CACHE / f"{key}.json"
    if out.exists():
        return json.loads(out.read_text())
    work = CACHE / "models" / audit_key({**a, "models": ["RF"]})   # the RF's cached predictions serve both
    work.mkdir(parents=True, exist_ok=True)
    t0, timing = time.perf_counter(), {}
    with threadpool_limits(1):
        d = cohort(a, fitness_n)
        timing["cohort_pairs_s"] = round(time.perf_counter() - t0, 1)
        train, lang, tf, levels = d["train"], d["lang"], d["text_fields"], d["levels"]
        y = train["triage_level"].astype(int).to_numpy()
        null_texts, tune_texts, diag = null_training_sets(d, a, timing)
        if a.get("normalise"):
            normalise_pairs(d)
        t = time.perf_counter()
        _, search = fit_rf_tfidf(tune_texts, y, levels, seed=a["seed"])
        best = search["best_params"]
        timing["rf_search_s"] = round(time.perf_counter() - t, 1)
        fits, preds = [], {}
        for k, texts in [("real", d["real_texts"])] + list(enumerate(null_texts)):
            t = time.perf_counter()
            seed_k = a["seed"] if (k == "real" or a["shared_seed"]) else a["seed"] + 1000 * (k + 1)
            def make(texts=texts, seed_k=seed_k, k=k):
                rf, _ = fit_rf_tfidf(texts, y, levels, seed=seed_k, fixed_params=best, max_samples=a.get("rf_max_samples") or None)
                if k == "real":
                    t2 = d["table2_test"]
                    test = pd.concat([t2[["record_id"]].assign(view="full", triage_level=t2["triage_level"].astype(int)
                                      .to_numpy()), proba_frame(proba_by_level(rf, record_texts(t2, "full", lang,
                                      text_fields=tf), levels), levels)], axis=1)
                    test.to_parquet(work / "real_test.parquet", index=False)
                return score_pairs(rf, d, levels)
            preds[k] = _cached_frame(work / f"pairs_{k}.parquet", make)
            fits.append(round(time.perf_counter() - t, 1))
        timing["rf_fit_score_s"] = fits
        if "MLP" in a.get("models", ["RF"]):
            render_pair_texts(d)
            mlp_preds = mlp_arm(d, a, null_texts, y, work, levels, timing)
        knobs = {k: v for k, v in synth_knobs(a["dataset"], a["n_records"], a["case_mix"], a["scale"]).items()
                 if k != "n_records"}
        orc = oracle_pair_predictions(d["pairs"], tf, levels, lang, knobs)
        t2 = d["table2_test"]
        op = oracle_proba(t2, lang, **knobs)[:, [l - 1 for l in levels]]
        orc_test = pd.concat([t2[["record_id"]].assign(view="full", triage_level=t2["triage_level"].astype(int).to_numpy()),
                              proba_frame(op / op.sum(1, keepdims=True), levels)], axis=1)
    t = time.perf_counter()
    oracle = with_expected(orc, d, "oracle", levels)
    rf = evaluate_arm("RF", preds, pd.read_parquet(work / "real_test.parquet"), d, a, oracle, orc_test, n_boot)
    arms = {}
    if "MLP" in a.get("models", ["RF"]):
        arms["MLP"] = evaluate_arm("MLP", mlp_preds, pd.read_parquet(work / "mlp_real_test.parquet"), d, a, oracle,
                                   orc_test, n_boot)
    timing["metrics_s"] = round(time.perf_counter() - t, 1)
    res = dict(version=VERSION, key=key, **a, n_cohort=len(d["cohort"]), n_train=len(train), n_pairs=len(d["ok"]),
               fitness_n=len(t2), **rf, rf_params={k: str(v) for k, v in best.items()}, arms=arms,
               null_diagnostics=diag, timing=timing, wall_s=round(time.perf_counter() - t0, 1),
               cpu=platform.processor() or platform.machine())
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=1))
    tmp.replace(out)
    return res


def tasks(args) -> list[dict]:
    "Audits in the order they run: small cohorts first, nothing planted first within a size (its level is the gate)."
    out = []
    for n, ds, cm, x, s in itertools.product(args.sizes, args.datasets, args.case_mix, args.scales, range(args.seeds)):
        out.append(dict(dataset=ds, n_records=int(n), case_mix=float(cm), scale=float(x), seed=int(args.first_seed + s),
                        K=int(args.K), null=args.null, shared_seed=bool(args.shared_seed), propensity=args.propensity,
                        normalise=bool(args.normalise), marked="both" if args.marked else False, models=list(args.models),
                        rf_max_samples=int(args.rf_max_samples or 0), pseudo_real=bool(args.pseudo_real)))
    return sorted(out, key=lambda a: (a["n_records"], a["seed"], a["scale"] > 0, a["case_mix"], a["dataset"], a["scale"]))


def backfill_values(path: Path) -> bool:
    """Add the RF's `emulator_values` to a finished audit that predates them, from its cached pair predictions (the
    cohort rebuilt as the audit built it); False where they are there already or the predictions are gone."""
    r = json.loads(path.read_text())
    work = CACHE / "models" / audit_key({**r, "models": ["RF"]})
    if "emulator_values" in r or not (work / "pairs_real.parquet").exists():
        return False
    d = cohort(r, 1000)
    if r.get("normalise"):
        normalise_pairs(d)
    pred = lambda k: with_expected(pd.read_parquet(work / f"pairs_{k}.parquet"), d, "RF", d["levels"])
    nulls = pd.concat([pred(k).assign(null_id=f"RF_null{k}") for k in range(r["K"])], ignore_index=True)
    r["emulator_values"] = emulator_values(pred("real"), nulls)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(r, indent=1))
    tmp.replace(path)
    return True


def backfill_assoc(path: Path) -> bool:
    """Add `sex_level_assoc` to a finished audit's null diagnostics that predates it: its cohort and null sexes drawn
    again as the audit drew them (both deterministic in the audit's seed); False where it is there already."""
    r = json.loads(path.read_text())
    if "sex_level_assoc" in r.get("null_diagnostics", {}):
        return False
    from threadpoolctl import threadpool_limits
    with threadpool_limits(1):
        diag = null_training_sets(cohort(r, 1000), r, {})[2]
    r["null_diagnostics"]["sex_level_assoc"] = diag["sex_level_assoc"]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(r, indent=1))
    tmp.replace(path)
    return True


def cmd_backfill(args) -> None:
    for path in sorted(CACHE.glob(args.pattern)):
        print(path.stem, "added" if backfill_values(path) else "skipped", "values;",
              "added" if args.assoc and backfill_assoc(path) else "skipped", "gap", flush=True)


def cmd_run(args) -> None:
    CACHE.mkdir(parents=True, exist_ok=True)
    todo = tasks(args)
    for i, a in enumerate(todo):
        done = (CACHE / f"{audit_key(a)}.json").exists()
        r = run_audit(a, args.fitness_n, args.n_boot)
        prim = next(c for c in r["checks"] if c["check"] == "primary")
        soft = next(c for c in r["soft_checks"] if c["condition"] == "full")
        took = "cached" if done else f"{r['wall_s']:.0f} s"
        print(f"[{i + 1}/{len(todo)}] {r['key']}: {took}; fit {r['fit_for_audit']} "
              f"(kappa_w {r['kappa_w']:.2f}); primary p {prim['p']:.3f} ({prim['estimate']:+.3f}, oracle "
              f"{prim['oracle_estimate']:+.3f}); {SOFT} p {soft['p']:.3f} ({soft['estimate']:+.4f}, oracle "
              f"{soft['oracle_estimate']:+.4f})", flush=True)


# ------------------------------------------------------------------ the summary: one row per cell
def _rate(k: int, n: int) -> dict:
    "k/n with its Clopper-Pearson 95% CI (statsmodels)."
    from statsmodels.stats.proportion import proportion_confint
    lo, hi = proportion_confint(k, n, method="beta") if n else (np.nan, np.nan)
    return dict(k=int(k), n=int(n), rate=k / n if n else None, ci=[float(lo), float(hi)] if n else None)


def _mean_t(fit: list[dict], metric: str) -> dict:
    "Per view, the mean over `fit` audits of `metric`'s t = (estimate - null mean) / null sd (None without audits)."
    return {v: _t_of(fit, metric, v)["mean"] for v in ("full", "text_iso", "tab_iso")}


def _t_of(fit: list[dict], metric: str, view: str) -> dict:
    """`metric`'s t in `view` over `fit` audits: mean, and its standard error from the means of the clusters of audits
    that share the generator's draws (same dataset and seed: a seed's cohorts at other case mixes or sizes reuse its
    random streams, correlation about 0.6 measured), with the number of clusters (None without audits)."""
    ts = [(r["dataset"], r["seed"], c["effect"] / c["null_sd"]) for r in fit for c in r["checks"]
          if c["metric"] == metric and c["condition"] == view and c["null_sd"] > 0]
    if not ts:
        return dict(mean=None, se=None, n_clusters=0)
    by = pd.DataFrame(ts, columns=["dataset", "seed", "t"]).groupby(["dataset", "seed"])["t"].mean()
    se = float(by.std(ddof=1) / np.sqrt(len(by))) if len(by) > 1 else None
    return dict(mean=float(np.mean([t for *_, t in ts])), se=se, n_clusters=int(len(by)))


def loo_t(values: list[float]) -> list[float]:
    """Each null emulator's predictive t against the other K - 1 (`metrics.null_test`): Student's t with K - 2 df when
    the nulls are exchangeable and their metric is normal, whatever the real emulator does (undefined t left out)."""
    from triage_cf.audit.metrics import null_test
    v = list(values)
    ts = [null_test([v[k]], v[:k] + v[k + 1:])["t"] for k in range(len(v))]
    return [float(t) for t in ts if np.isfinite(t)]


def t_calibration(fit: list[dict], view: str, metric: str = "female_skew", alpha: float = 0.05) -> dict:
    """The test's own calibration in `view`: the mean, root mean square (about 0: offset and spread together) and
    two-sided rejection rate of the real emulator's predictive t (Student's t with K - 1 df if it is exchangeable with
    its nulls) beside the nulls' leave-one-out t (`loo_t`, K - 2 df), with the SDs Student's t would give. A real t that
    spreads wider than its nulls' means the real emulator is not exchangeable with them; nulls that spread wider too
    mean the t reference itself does not hold."""
    from scipy import stats
    ev = [r["emulator_values"][view][metric] for r in fit if "emulator_values" in r]
    real = [c["effect"] / c["null_sd"] / np.sqrt(1 + 1 / r["K"]) for r in fit for c in r["checks"]
            if c["condition"] == view and c["metric"] == metric and c["null_sd"] > 0]
    loo = [t for e in ev for t in loo_t(e["nulls"])]
    K = fit[0]["K"] if fit else 0
    sd_t = lambda df: float(np.sqrt(df / (df - 2))) if df > 2 else None
    rate = lambda ts, df: float(np.mean(np.abs(ts) > stats.t.ppf(1 - alpha / 2, df))) if len(ts) else None
    rms = lambda ts: float(np.sqrt(np.mean(np.square(ts)))) if len(ts) else None
    return dict(real_t_mean=float(np.mean(real)) if real else None, real_t_rms=rms(real), real_t_rate=rate(real, K - 1),
                n_real=len(real), student_sd_real=sd_t(K - 1), loo_t_rms=rms(loo), loo_t_rate=rate(loo, K - 2),
                n_loo=len(loo), n_audits_loo=len(ev), student_sd_loo=sd_t(K - 2))


def assoc_calibration(fit: list[dict]) -> dict:
    """The sampler's own check, no emulator: the real sexes' women-minus-men level gap (`sex_level_assoc`) as a
    predictive t against the K null copies' (Student's with K - 1 df if the null sexes are exchangeable with the real
    ones under q-hat), its root mean square, and the least-squares slope and correlation of the real RF's full-view
    female-skew t on it over the audits: an emulator t that follows the gap's t with slope near 1 amplifies nothing;
    a gap t that spreads as Student's while the emulator's does not puts the excess in the emulator, not in q-hat."""
    from triage_cf.audit.metrics import null_test
    pairs = []
    for r in fit:
        a = (r.get("null_diagnostics") or {}).get("sex_level_assoc")
        t = _primary_t(r)
        if a and t is not None:
            pairs.append((null_test([a["real"]], a["nulls"])["t"], t))
    x, y = (np.array(v, float) for v in zip(*pairs)) if pairs else (np.array([]), np.array([]))
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    slope = float(np.polyfit(x, y, 1)[0]) if len(x) > 2 else None
    return dict(n=int(len(x)), gap_t_mean=float(x.mean()) if len(x) else None,
                gap_t_rms=float(np.sqrt(np.mean(x ** 2))) if len(x) else None,
                slope_emulator_on_gap=slope, corr=float(np.corrcoef(x, y)[0, 1]) if len(x) > 2 else None)


def primary_tests(fit: list[dict], alpha: float = 0.05) -> dict:
    """The primary check (female skew, full view) of the same audits decided three ways from their kept per-emulator
    values (`emulator_values`): the predictive t with the first 9 null emulators (the default profile's K), the t with
    all K, and the exact rank test with all K where `rank_decides`; per test, the rejection rate (with nothing planted
    the level; planted, power with the oracle's sign)."""
    from triage_cf.audit.metrics import null_test, rank_decides
    tests = {}
    for r in fit:
        ev = (r.get("emulator_values") or {}).get("full", {}).get("female_skew")
        prim = next((c for c in r["checks"] if c["check"] == "primary"), None)
        if not ev or prim is None:
            continue
        sign = np.sign(prim["oracle_estimate"]) if r["scale"] > 0 else 0
        runs = {f"t, K = {min(9, r['K'])}": (ev["nulls"][:9], "t"), f"t, K = {r['K']}": (ev["nulls"], "t")}
        if rank_decides(r["K"], alpha=alpha):
            runs[f"rank, K = {r['K']}"] = (ev["nulls"], "auto")
        for name, (nulls, method) in runs.items():   # a dict: K = 9 names one test once
            t = null_test([ev["real"]], nulls, alpha=alpha, method=method)
            hit = t["p"] < alpha and (sign == 0 or np.sign(t["effect"]) == sign)
            tests.setdefault(name, []).append(bool(hit))
    return {name: _rate(sum(v), len(v)) for name, v in sorted(tests.items())}


def _cell(rs: list[dict], alpha: float) -> dict:
    "The measured figures of one cell's audits (only fit audits count for rates; unfit ones are counted)."
    fit = [r for r in rs if r["fit_for_audit"]]
    planted = rs[0]["scale"] > 0
    out = dict(n_audits=len(rs), n_fit=len(fit), wall_s_median=float(np.median([r["wall_s"] for r in rs])),
               n_pairs_median=float(np.median([r["n_pairs"] for r in rs])),
               kappa_w_median=float(np.median([r["kappa_w"] for r in rs])))
    raw = [c for r in fit for c in r["checks"] if np.isfinite(c["p"])]
    out["raw_check_rate"] = _rate(sum(c["p"] < alpha for c in raw), len(raw))
    out["finding_rate_any_check"] = _rate(sum(any(c["finding"] for c in r["checks"]) for r in fit), len(fit))
    # the systematic offset of the real RF from its nulls: mean t = (estimate - null mean) / null sd of the female skew
    # and of PDR per view (0 in expectation when the real and null emulators are exchangeable; its SE from clusters of
    # audits that share a seed: `_t_of`), and the test's own calibration (`t_calibration`)
    out["female_skew_mean_t"], out["pdr_mean_t"] = _mean_t(fit, "female_skew"), _mean_t(fit, "PDR")
    out["female_skew_t"] = {v: _t_of(fit, "female_skew", v) for v in ("full", "text_iso", "tab_iso")}
    out["t_calibration"] = {v: t_calibration(fit, v) for v in ("full", "text_iso", "tab_iso")}
    out["assoc_calibration"] = assoc_calibration(fit)
    out["primary_tests"] = primary_tests(fit, alpha)
    rq = [r.get("null_diagnostics", {}).get("q_generator_logit_corr") for r in fit]
    rq = [v for v in rq if v is not None]
    out["q_generator_logit_corr"] = dict(mean=float(np.mean(rq)) if rq else None, n=len(rq))
    for name, pick in (("argmax", lambda r: next(c for c in r["checks"] if c["check"] == "primary")),
                       ("expected", lambda r: next(c for c in r["soft_checks"] if c["condition"] == "full"))):
        cs = [pick(r) for r in fit]
        sig = [c["p"] < alpha for c in cs]
        same_sign = [c["p"] < alpha and np.sign(c["effect"]) == np.sign(c["oracle_estimate"]) for c in cs]
        att = [c["estimate"] / c["oracle_estimate"] for c in cs if planted and c["oracle_estimate"] != 0]
        # power without counting: the mean t = effect / null sd, in the oracle's direction where something is planted
        # (the statistic with the larger mean t at the same level has more power; a handful of audits measure it)
        t = [c["effect"] / c["null_sd"] * (np.sign(c["oracle_estimate"]) if planted else 1) for c in cs if c["null_sd"] > 0]
        out[name] = dict(metric=cs[0]["metric"] if cs else None, rate=_rate(sum(sig), len(cs)),
                         power_oracle_sign=_rate(sum(same_sign), len(cs)) if planted else None,
                         mde_median=float(np.median([c["mde"] for c in cs])) if cs else None,
                         estimate_mean=float(np.mean([c["estimate"] for c in cs])) if cs else None,
                         oracle_mean=float(np.mean([c["oracle_estimate"] for c in cs])) if cs else None,
                         attenuation_mean=float(np.mean(att)) if att else None, t_mean=float(np.mean(t)) if t else None)
    return out


#: the design fields that make a cell (with dataset, size, case mix and planted scale); older audits lack the later ones
DESIGN = dict(null="conditional", propensity="tabular-insample", normalise=False, marked="none", shared_seed=False,
              rf_max_samples=0, pseudo_real=False)   # 0: no cap


def _primary_t(r: dict) -> float | None:
    "An audit's primary-check predictive t (Student's, K - 1 df, if the real emulator is exchangeable with its nulls)."
    c = next((c for c in r["checks"] if c["check"] == "primary" and c["null_sd"] > 0), None)
    return None if c is None else c["effect"] / c["null_sd"] / np.sqrt(1 + 1 / r["K"])


def paired_designs(rs: list[dict]) -> list[dict]:
    """Each ablation against the release design on the same nothing-planted cohorts (dataset, size, case mix, seed):
    the two real RFs' primary t side by side (their correlation, root mean squares and rejection counts). The real RF is
    the same model under both designs (same records, seed and, most often, hyperparameters), so a design that changes
    only the nulls moves t through them alone, and the pairing shows how much."""
    from scipy import stats
    key = lambda r: (r["dataset"], r["n_records"], r["case_mix"], r["seed"])
    fit = [r for r in rs if r["model"] == "RF" and r["scale"] == 0 and r["fit_for_audit"]
           and r["null"] == "conditional"]
    rel = {key(r): r for r in fit if release_design(r)}
    name = lambda r: ", ".join([r["propensity"]] + (["normalise"] if r["normalise"] else [])
                               + (["pseudo-real"] if r["pseudo_real"] else []))
    out = {}
    for r in fit:
        if release_design(r) or r["marked"] != "both renderings" or key(r) not in rel:
            continue
        t0, t1 = _primary_t(rel[key(r)]), _primary_t(r)
        if t0 is not None and t1 is not None:
            out.setdefault((name(r), r["case_mix"]), []).append((t0, t1, float(stats.t.ppf(0.975, r["K"] - 1))))
    rms = lambda v: float(np.sqrt(np.mean(np.square(v))))
    rejections = lambda v: int(sum(abs(t) > c for t, c in v))
    corr = lambda v: float(np.corrcoef(np.array(v)[:, :2].T)[0, 1]) if len(v) > 2 else None
    return [dict(design=d, case_mix=cm, n=len(v), corr=corr(v),
                 release_rms=rms([a for a, *_ in v]), design_rms=rms([b for _, b, _ in v]),
                 release_rejections=rejections([(a, c) for a, _, c in v]),
                 design_rejections=rejections([(b, c) for _, b, c in v]))
            for (d, cm), v in sorted(out.items())]


def _arms(r: dict):
    "An audit's records per model: the RF's (top level) and each other arm's (`arms`), the audit's design fields shared."
    r = {**DESIGN, **r}
    r["marked"] = {True: "male rendering", "both": "both renderings"}.get(r["marked"], "none")   # what fixed records
    yield {**r, "model": "RF"}
    for m, v in (r.get("arms") or {}).items():
        yield {**r, **v, "model": m}


def audit_records(cache: Path = CACHE, records: Path = RECORDS) -> list[dict]:
    """Every finished audit: the committed records (`RECORDS`) and the cache's JSONs (the cache wins on a key in both),
    written back to `RECORDS` so that a commit keeps them."""
    import gzip
    got = {}
    if records.exists():
        with gzip.open(records, "rt") as f:
            got = {r["key"]: r for r in map(json.loads, f)}
    got.update({r["key"]: r for r in (json.loads(p.read_text()) for p in sorted(cache.glob("v*.json")))})
    tmp = records.with_suffix(".tmp")
    with gzip.GzipFile(tmp, "wb", mtime=0) as f:   # mtime 0: the same audits give the same bytes
        f.write("".join(json.dumps(got[k], separators=(",", ":")) + "\n" for k in sorted(got)).encode())
    tmp.replace(records)
    return [got[k] for k in sorted(got)]


def carried_over(old: list[dict], new: list[dict], key) -> list[dict]:
    """The rows of an earlier summary whose per-audit records were not kept (audits before the records were committed)
    and that no record re-measures: kept as they were, labelled, so that a summary never loses a measured cell."""
    have = {key(c) for c in new}
    return [{**c, "records": c.get("records", "summary only: its audits' records were not kept")}
            for c in old if key(c) not in have]


def summarise(cache: Path = CACHE, result: Path = RESULT, figure: Path = FIGURE, alpha: float = 0.05) -> dict:
    "Pool the finished audits (`audit_records`) into the results JSON (and figure): per cell and per case mix pooled."
    audits = [r for r in audit_records(cache) if r.get("version") == VERSION]
    rs = [x for r in audits for x in _arms(r)]
    design = ("model", *DESIGN, "K")
    cell_of = ("dataset", "n_records", "case_mix", "scale")
    cells, pooled = [], []
    key = lambda r: tuple(r.get(k) for k in design + cell_of)   # .get: carried rows may predate a field (K)
    for k, g in itertools.groupby(sorted(rs, key=key), key=key):
        g = list(g)
        cells.append(dict(zip(design + cell_of, k), seeds=sorted(r["seed"] for r in g), **_cell(g, alpha)))
    pk = lambda r: tuple(r.get(k) for k in design + ("case_mix",))
    for k, g in itertools.groupby(sorted([r for r in rs if r["scale"] == 0], key=pk), key=pk):
        g = list(g)
        pooled.append(dict(zip(design + ("case_mix",), k), sizes=sorted({r["n_records"] for r in g}),
                           datasets=sorted({r["dataset"] for r in g}), **_cell(g, alpha)))
    prev = json.loads(result.read_text()) if result.exists() else {}
    cells += carried_over(prev.get("cells", []), cells, key)
    pooled += carried_over(prev.get("pooled_nothing_planted", []), pooled, pk)
    n_carried = sum(c["n_audits"] for c in cells if "records" in c)
    paired = paired_designs(rs)
    out = dict(benchmark="calibration_scale", version=VERSION, alpha=alpha, models=sorted({c["model"] for c in cells}),
               n_audits=len(audits) + n_carried, n_audit_records=len(audits),
               machine=f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}",
               covers=sorted({f"{c['model']} {c['dataset']} n={c['n_records']}" for c in cells}),
               note=("Partial: the cells listed are the ones measured; sizes, case mixes and arms not listed are not "
                     "measured here, and the FT emulator is GPU-only (not on this curve)."),
               cells=cells, pooled_nothing_planted=pooled, paired_designs=paired + carried_over(
                   prev.get("paired_designs", []), paired, lambda q: (q["design"], q["case_mix"], q.get("K"))),
               level_audits_needed=dict(n=GRID["pooled"], why=(
                   "nothing-planted audits per case mix at which a test whose level is exactly 5% verifies it: "
                   "ceil(0.05 n) false findings with a Clopper-Pearson upper bound under 10% (pooled_audits_needed)")))
    result.write_text(json.dumps(out, indent=1))
    write_curve(cells)
    if cells:
        figure_power(cells, figure)
    return out


def release_design(c: dict, marked: str = "both renderings") -> bool:
    "Whether a cell ran this release's null design (stage 04's defaults; no cap, no ablation), or `marked` in its place."
    return (c["null"] == "conditional" and c["propensity"] == "notes" and c["marked"] == marked and not c["normalise"]
            and not c["shared_seed"] and not c["rf_max_samples"] and not c["pseudo_real"])


def curve_design(cells: list[dict]) -> str:
    """The sex-marked rule of the cells the curve reads: this release's (both renderings) where they cover at least two
    sizes, else the previous rule (male rendering), which the JSON then names."""
    sizes = lambda m: {c["n_records"] for c in cells if release_design(c, m) and c["scale"] == 0}
    return "both renderings" if len(sizes("both renderings")) >= 2 or not sizes("male rendering") else "male rendering"


def level_rows(cells: list[dict]) -> list[dict]:
    """The primary check's false findings with nothing planted, per model, test and size (case mixes and languages
    pooled): `rank` from the cells whose K lets the exact rank test decide (`rank_decides`); `t` from the others'
    decisions and from those cells' predictive t with their first 9 nulls (`primary_tests`: the same test a K = 9 audit
    runs, on an identically drawn null set)."""
    from triage_cf.audit.metrics import rank_decides
    got = {}
    for c in cells:
        rank = rank_decides(c["K"])
        parts = [("rank" if rank else "t", c["argmax"]["rate"])]
        parts += [("t", c["primary_tests"]["t, K = 9"])] if rank and "t, K = 9" in c.get("primary_tests", {}) else []
        for test, rate in parts:
            g = got.setdefault((c["model"], test, c["n_records"]),
                               dict(k=0, n=0, pairs=[], cm=set(), ds=set(), K=set()))
            g["k"] += rate["k"]; g["n"] += rate["n"]; g["pairs"].append(c["n_pairs_median"])
            g["cm"].add(c["case_mix"]); g["ds"].add(c["dataset"]); g["K"].add(c["K"])
    return [dict(model=m, test=t, n_records=n, n_pairs=float(np.median(g["pairs"])), k=g["k"], n=g["n"],
                 case_mix=sorted(g["cm"]), datasets=sorted(g["ds"]), K=sorted(g["K"]))
            for (m, t, n), g in sorted(got.items())]


def write_curve(cells: list[dict], path: Path = REPO / "triage_cf" / "resources" / "calibration_curve.json") -> None:
    """The package's copy of the measured curve (`triage_cf.audit.plan.calibration_curve`): per model, statistic, case
    mix and size, the median MDE of the primary check with nothing planted (the curve's null design, datasets pooled)
    and the mean attenuation over the planted cells of any conditional design (the real emulator's estimate over the
    oracle's does not depend on how its nulls are drawn)."""
    rows = []
    key = lambda c: (c["model"], c["case_mix"], c["n_records"])
    design = curve_design(cells)
    from triage_cf.audit.metrics import rank_decides   # the curve is the predictive t's (the default profile's K)
    cond = sorted([c for c in cells if release_design(c, design) and not rank_decides(c["K"])], key=key)
    planted = [c for c in cells if c["scale"] > 0 and c["null"] == "conditional" and not c["normalise"]
               and not c["rf_max_samples"] and not c["pseudo_real"]]
    for (model, cm, n), g in itertools.groupby(cond, key=key):
        g = list(g)
        for stat in ("argmax", "expected"):
            null = [c[stat]["mde_median"] for c in g if c["scale"] == 0 and c[stat]["mde_median"] is not None]
            att = [c[stat]["attenuation_mean"] for c in planted if key(c) == (model, cm, n)
                   and c[stat]["attenuation_mean"] is not None]
            rows.append(dict(model=model, statistic=stat, case_mix=cm, n_records=n,
                             mde=float(np.median(null)) if null else None, attenuation=float(np.mean(att)) if att else None,
                             n_audits=int(sum(c["n_fit"] for c in g))))
    level = level_rows([c for c in cells if release_design(c, design) and c["scale"] == 0])
    path.write_text(json.dumps(dict(source="benchmarks/calibration_scale.py", version=VERSION,
                                    design=f"conditional null, notes' propensity, sex-marked words ({design})",
                                    rows=rows, level=level),
                               indent=1) + "\n")


def figure_power(cells: list[dict], path: Path) -> None:
    """Per case mix (columns): the primary check's rejection rate (nothing planted: the level; planted: power with the
    oracle's sign) and its median MDE against cohort size, per model, for the argmax female skew and NMDF_expected,
    with this release's null design (conditional, the notes' propensity, sex-marked records fixed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from triage_cf.audit.metrics import rank_decides   # the curve of the predictive t (the rank test's K: a table)
    df = pd.DataFrame([dict(model=c["model"], n=c["n_records"], case_mix=c["case_mix"], scale=c["scale"], stat=s,
                            rate=(c[s]["power_oracle_sign"] or c[s]["rate"])["rate"], mde=c[s]["mde_median"])
                       for c in cells if release_design(c, curve_design(cells)) and not rank_decides(c["K"])
                       for s in ("argmax", "expected") if c[s]["rate"]["n"]])
    if df.empty:
        return
    mixes = sorted(df["case_mix"].unique())
    fig, axes = plt.subplots(2, len(mixes), figsize=(4.4 * len(mixes), 6.8), squeeze=False)
    names = {"argmax": "skew", "expected": "NMDF_E"}
    for j, cm in enumerate(mixes):
        d = df[df["case_mix"] == cm]
        for (model, stat, scale), g in d.groupby(["model", "stat", "scale"]):
            g = g.groupby("n").rate.mean()
            axes[0, j].plot(g.index, g.values, marker="o" if stat == "argmax" else "s", ls="-" if scale else ":",
                            color="C0" if model == "RF" else "C1", alpha=0.5 + 0.1 * min(scale, 5),
                            label=f"{model} {names[stat]} x{scale:g}")
        axes[0, j].axhline(0.05, color="grey", lw=0.8)
        axes[0, j].set(xscale="log", ylim=(-0.03, 1.03), title=f"case mix by sex {cm:g}", xlabel="records",
                       ylabel="rejection rate (x0: level; planted: power)" if j == 0 else "")
        for (model, stat), g in d[d["scale"] == 0].groupby(["model", "stat"]):
            g = g.groupby("n").mde.median()
            axes[1, j].plot(g.index, g.values, marker="o" if stat == "argmax" else "s", color="C0" if model == "RF" else "C1",
                            label=f"{model} {names[stat]} ({'proportion' if stat == 'argmax' else 'levels'})")
        axes[1, j].set(xscale="log", yscale="log", xlabel="records", ylabel="median MDE, nothing planted" if j == 0 else "")
    axes[0, 0].legend(fontsize=6)
    axes[1, 0].legend(fontsize=7)
    fig.suptitle("Conditional null (notes' propensity, sex-marked records fixed), predictive t: level, power, MDE",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def pooled_audits_needed(level: float = 0.05, bound: float = 0.10, step: int = 10) -> int:
    """The fewest audits (in `step`s) at which a test of exactly `level` verifies it: ceil(`level` x audits) false
    findings have a Clopper-Pearson upper bound under `bound` (fewer audits verify only a level well below `level`)."""
    from statsmodels.stats.proportion import proportion_confint
    n = step
    while proportion_confint(int(np.ceil(level * n)), n, method="beta")[1] >= bound:
        n += step
    return n


#: issue 37's grid: sizes, case mixes, planted scales and languages (the MLP arm up to `mlp_max_size`); the audits wanted
#: per cell and language (`per_cell`) and, with nothing planted, per case mix pooled over the sizes and languages
#: (`pooled`: a test whose level is exactly 5% shows 8 false findings in 160 audits on average, and 8/160 is the
#: first such count whose Clopper-Pearson upper bound is under 10%: `pooled_audits_needed`; 36 would need 0 of 36)
GRID = dict(sizes=(3000, 12000, 48000, 100000), case_mix=(0.0, 1.0, 2.0), scales=(0.0, 1.0, 2.0, 5.0),
            datasets=("synth-en", "synth-fr"), mlp_max_size=24000, per_cell=1, pooled=pooled_audits_needed())


def _cpu_min(cells: list[dict], model: str, n: int) -> float | None:
    """Minutes one audit of `model` at `n` records takes (an estimate): a power law in size through the median, per
    measured size, of the cells' median wall times (no RF cap; times on this shared machine, other runs beside)."""
    by = pd.DataFrame([(c["n_records"], c["wall_s_median"]) for c in cells if c["model"] == model], columns=["n", "s"])
    if by.empty:
        return None
    pts = by.groupby("n")["s"].median()
    x, y = np.log(pts.index.to_numpy(float)), np.log(pts.to_numpy())
    b = np.polyfit(x, y, 1) if len(set(x)) > 1 else (1.0, y.mean() - x.mean())
    return float(np.exp(np.polyval(b, np.log(n))) / 60)


def missing(cells: list[dict]) -> pd.DataFrame:
    "The release design's audits the grid still wants per model, size, case mix and scale, with the CPU-hours they need."
    rel = [c for c in cells if release_design(c)]
    have = lambda m, n, cm, x: sum(c["n_fit"] for c in rel if (c["model"], c["n_records"], c["case_mix"], c["scale"]) == (m, n, cm, x))
    rows = []
    for m in ("RF", "MLP"):
        for n, cm, x in itertools.product(GRID["sizes"], GRID["case_mix"], GRID["scales"]):
            if m == "MLP" and n > GRID["mlp_max_size"]:
                continue
            want = GRID["per_cell"] * len(GRID["datasets"])
            rows.append(dict(model=m, n_records=n, case_mix=cm, scale=x, have=have(m, n, cm, x), want=want))
    out = pd.DataFrame(rows)
    for (m, cm), g in out[out.scale == 0].groupby(["model", "case_mix"]):   # the pooled bound: top up the smallest size
        extra = max(0, GRID["pooled"] - max(g.have.sum(), g.want.sum()))
        out.loc[g.index[0], "want"] += extra
    out["to_run"] = (out.want - out.have).clip(lower=0)
    out["cpu_h"] = [r.to_run * (_cpu_min(cells, r.model, r.n_records) or np.nan) / 60 for r in out.itertuples()]
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--datasets", nargs="+", default=["synth-fr", "synth-en"])
    r.add_argument("--sizes", nargs="+", type=int, default=[3000, 12000])
    r.add_argument("--case-mix", nargs="+", type=float, default=[0.0, 1.0, 2.0])
    r.add_argument("--scales", nargs="+", type=float, default=[0.0, 1.0, 2.0, 5.0])
    r.add_argument("--seeds", type=int, default=4)
    r.add_argument("--first-seed", type=int, default=1)
    r.add_argument("--K", type=int, default=9)
    r.add_argument("--null", choices=["conditional", "uniform"], default="conditional")
    r.add_argument("--shared-seed", action="store_true")
    r.add_argument("--propensity", choices=["notes", "notes-all", "tabular", "generator"], default="notes",
                   help="what the conditional null's P(sex | case mix) reads: the tabular fields and the sex-neutral notes, "
                        "the same learnt from the test split's records too (notes-all: only the training records move), "
                        "the tabular fields only (the first design), or none: the synthetic cohort's own from its "
                        "generator (`generator_propensity`: what a perfect q-hat would give)")
    r.add_argument("--normalise", action="store_true",
                   help="every note in g's rendering (round trip) for the real RF, its nulls and both sides of every pair")
    r.add_argument("--marked", action=argparse.BooleanOptionalAction, default=True,
                   help="records whose notes, rendered for either sex, hold a sex-marked word g leaves (sex_marked_terms) "
                        "keep their sex (stage 04's null_fix_marked, default true)")
    r.add_argument("--models", nargs="+", choices=["RF", "MLP"], default=["RF"],
                   help="the arms: RF always; MLP (MiniLM embeddings) beside it on the same cohort, nulls and pairs")
    r.add_argument("--rf-max-samples", type=int, default=None,
                   help="each tree of the RFs (real and null) draws at most this many records (stage 06's rf_max_samples)")
    r.add_argument("--pseudo-real", action="store_true",
                   help="a check of the procedure: the audited RF trains on one conditional draw of the sexes (its "
                        "notes through g) in place of the real ones, its nulls drawn from that, as if it were real")
    r.add_argument("--fitness-n", type=int, default=1000)
    r.add_argument("--n-boot", type=int, default=200)
    b = sub.add_parser("backfill", help="add the RF's per-emulator values to finished audits that predate them")
    b.add_argument("--pattern", default="v*.json")
    b.add_argument("--assoc", action="store_true", help="also the sampler's raw statistic (`sex_level_assoc`): draws "
                   "each audit's cohort and null sexes again (about a minute per audit)")
    s = sub.add_parser("summarise")
    s.add_argument("--alpha", type=float, default=0.05)
    sub.add_parser("missing", help="the audits issue 37's grid still wants (release design) and their CPU-hours")
    args = ap.parse_args(argv)
    if args.cmd == "run":
        cmd_run(args)
    elif args.cmd == "backfill":
        cmd_backfill(args)
    elif args.cmd == "missing":
        m = missing(json.loads(RESULT.read_text())["cells"] if RESULT.exists() else [])
        print(m[m.to_run > 0].to_string(index=False))
        print(f"to run: {int(m.to_run.sum())} audits, about {m.cpu_h.sum():.0f} CPU-hours "
              f"({int(m.cpu_h.isna().sum())} rows with no measured time: not counted)")
    else:
        out = summarise(CACHE, RESULT, FIGURE, args.alpha)
        print(f"{out['n_audits']} audits -> {RESULT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
