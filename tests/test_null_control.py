"""The audit's test end to end on small synthetic cohorts, through the stages' own functions: stage 04's conditional
permutation (`null_design`: the notes' propensity, sex-marked records fixed, K copies + the tuning copy, `permute_sex`
rewriting the re-sexed notes, null emulator k with
`null_training_seed`), stage 06's RF search on the tuning copy and the real RF and its null RFs on those
hyperparameters (`fixed_params`), 07's pairs, 08's scoring, 09's fitness verdict and `permutation_test`. With nothing planted the fit RF has no primary finding and at most one secondary one of its 18
checks; with a large planted tabular effect it has findings in the full and the tabular-isolated views. The test's level and power are measured
over many cohorts in benchmarks/null_calibration.py; these two cohorts (fixed seeds, K = 5) pin its behaviour."""
from __future__ import annotations

import pandas as pd
import pytest

from triage_cf.audit.baselines import fit_rf_tfidf, proba_by_level, record_texts
from triage_cf.cohort import apply_cohort
from triage_cf.audit.counterfactuals import build_pairs
from triage_cf.data import load_manifest, load_records
from triage_cf.audit.emulator import proba_frame, stratified_subsample
from triage_cf.audit.metrics import EXPECTED_METRICS, TESTED_METRICS, fitness_table, permutation_test
from triage_cf.audit.null_control import null_design, null_training_seed, permute_sex, sex_level_association
from triage_cf.audit.predict import pairs_for_metrics, text_model_pair_predictions
from triage_cf.audit.split import stratified_split

GRID = {"tfidf__ngram_range": [(1, 1)], "rf__n_estimators": [100], "rf__min_samples_leaf": [1, 2]}
K = 5


def _audit(bias_tab: float, n_records: int = 1400, seed: int = 7) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    "(permutation_test table, fitness table, info) of an RF emulator and K null RFs on a synth-en cohort."
    manifest = load_manifest("synth-en")
    lang, tf = manifest["language"], list(manifest.get("text_fields", []))
    records, _ = load_records(manifest, seed=seed, synth={"n_records": n_records, "bias_tab": bias_tab, "bias_text": 0.0})
    cohort = apply_cohort(records, manifest["cohort"], rows_read=len(records)).cohort
    split = stratified_split(cohort, 0.5, seed=seed)
    part = dict(zip(split.record_id, split.split))
    train = cohort[cohort.record_id.map(part) == "train"].sort_values("record_id").reset_index(drop=True)
    test = cohort[cohort.record_id.map(part) == "test"].sort_values("record_id").reset_index(drop=True)
    levels = sorted(int(l) for l in cohort.triage_level.unique())
    y = train.triage_level.astype(int).to_numpy()
    sexes, design = null_design(train, tf, lang, K + 1, seed)                  # stage 04's defaults: K nulls + tuning copy
    copies = [permute_sex(train, tf, lang, rewrites=design["rewrites"], new_sex=s) for s in sexes]
    _, rep = fit_rf_tfidf(record_texts(copies[K][0], "full", lang, text_fields=tf), y, levels, seed=seed, param_grid=GRID)
    rf, _ = fit_rf_tfidf(record_texts(train, "full", lang, text_fields=tf), y, levels, seed=seed,
                         fixed_params=rep["best_params"])
    info = dict(copies[0][1], before=sex_level_association(train), after=sex_level_association(copies[0][0]))
    nulls = [fit_rf_tfidf(record_texts(permuted, "full", lang, text_fields=tf), y, levels, seed=null_training_seed(seed, k),
                          fixed_params=rep["best_params"])[0] for k, (permuted, _) in enumerate(copies[:K])]
    pairs = build_pairs(test, tf, lang)
    ok = pairs[pairs.in_pairs]
    scored = lambda m: pairs_for_metrics(text_model_pair_predictions(lambda t: proba_by_level(m, t, levels), pairs, tf,
                                                                     levels, lang), ok, "RF")
    null_pairs = pd.concat([scored(m).assign(null_id=f"RF_null{k}") for k, m in enumerate(nulls)], ignore_index=True)
    t2, _ = stratified_subsample(test, 200, seed=seed)          # 05_emulator's Table 2 test records (fitness)
    t2 = t2.reset_index(drop=True)
    test_pred = pd.concat([t2[["record_id"]].assign(view="full", triage_level=t2.triage_level.astype(int).to_numpy()),
                           proba_frame(proba_by_level(rf, record_texts(t2, "full", lang, text_fields=tf), levels), levels)],
                          axis=1)
    fitness = fitness_table({"RF": test_pred}, levels, n_boot=300, seed=seed)
    pt = permutation_test(scored(rf), null_pairs, fitness, n_boot=300, seed=seed)
    return pt, fitness, dict(info, n_pairs=len(ok))


@pytest.fixture(scope="module")
def nothing_planted():
    return _audit(bias_tab=0.0, n_records=3000)   # the default profile's cohort size: a fit RF (at 1,400, kappa_w 0.20)


def test_permutation_keeps_the_women_and_moves_sexes(nothing_planted):
    info = nothing_planted[2]
    assert info["female_share_before"] == info["female_share_after"]
    assert info["n_sex_changed"] > 0.3 * info["n_eligible"] and info["n_eligible"] > 0.9 * info["n_records"]


def test_nothing_planted_no_finding(nothing_planted):
    pt, fitness, info = nothing_planted
    assert bool(fitness.set_index("model").loc["RF", "fit_for_audit"]), fitness   # a fit model: the check is not vacuous
    assert len(pt) == 3 * (len(TESTED_METRICS) + len(EXPECTED_METRICS)) and info["n_pairs"] > 500 and (pt.n_null == K).all()
    assert pt.p.notna().all() and (pt.check == "primary").sum() == 1
    found = pt[pt.finding.fillna(False)][["condition", "metric", "check", "estimate", "null_median", "p", "q"]]
    # issue 37's criterion: no primary finding and at most one secondary one (this cohort, with the default case mix
    # by sex, has one: text_iso NATS_down, q = 0.0006; the calibration benchmark measures how often this happens)
    assert not (found.check == "primary").any() and len(found) <= 1, found


def test_a_large_planted_tabular_effect_is_a_finding_in_the_full_and_tabular_views():
    pt, fitness, info = _audit(bias_tab=1.5)
    assert info["before"]["cramers_v"] > info["after"]["cramers_v"]
    assert bool(fitness.set_index("model").loc["RF", "fit_for_audit"]), fitness
    found = pt[pt.finding.fillna(False)]
    assert {"full", "tab_iso"} <= set(found.condition), pt[["condition", "metric", "estimate", "null_median", "p", "q"]]
    primary = pt[pt.check == "primary"].iloc[0]
    assert bool(primary.finding) and primary.effect > 0, primary      # women get the less severe level more often
