"""The null control end to end on a small synthetic cohort, through the stages' own functions (03e permutation, 04b RF,
05 pairs, 06 scoring, 07 null comparison): with nothing planted no metric exceeds the null; with a large planted
tabular effect the model's sex effect does (so the first check is not vacuous)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from triage_cf.baselines import fit_rf_tfidf, proba_by_level, record_texts
from triage_cf.cohort import apply_cohort
from triage_cf.counterfactuals import build_pairs
from triage_cf.data import load_manifest, load_records
from triage_cf.metrics import METRICS, add_null_columns, null_comparison, table3
from triage_cf.null_control import permute_sex, sex_level_association
from triage_cf.predict import pairs_for_metrics, text_model_pair_predictions
from triage_cf.split import stratified_split

GRID = {"tfidf__ngram_range": [(1, 1)], "rf__n_estimators": [100], "rf__min_samples_leaf": [2]}


def _audit(bias_tab: float, n_records: int = 1400, seed: int = 7) -> tuple[pd.DataFrame, dict]:
    "Table 3 of an RF emulator with null columns from its permuted-sex twin, on a synth-en cohort with these knobs."
    manifest = load_manifest("synth-en")
    lang, text_fields = manifest["language"], list(manifest.get("text_fields", []))
    records, _ = load_records(manifest, seed=seed, synth={"n_records": n_records, "bias_tab": bias_tab, "bias_text": 0.0})
    cohort = apply_cohort(records, manifest["cohort"], rows_read=len(records)).cohort
    split = stratified_split(cohort, 0.5, seed=seed)
    part = dict(zip(split.record_id, split.split))
    train = cohort[cohort.record_id.map(part) == "train"].sort_values("record_id").reset_index(drop=True)
    test = cohort[cohort.record_id.map(part) == "test"].sort_values("record_id").reset_index(drop=True)
    levels = sorted(int(l) for l in cohort.triage_level.unique())
    permuted, counts = permute_sex(train, text_fields, lang, seed=[seed, 0])
    y = train.triage_level.astype(int).to_numpy()
    rf = fit_rf_tfidf(record_texts(train, "full", lang, text_fields=text_fields), y, levels, seed=seed, param_grid=GRID)[0]
    rf_null = fit_rf_tfidf(record_texts(permuted, "full", lang, text_fields=text_fields), y, levels, seed=seed, param_grid=GRID)[0]
    pairs = build_pairs(test, text_fields, lang)
    ok = pairs[pairs.in_pairs]
    long = pd.concat([pairs_for_metrics(text_model_pair_predictions(lambda t, m=m: proba_by_level(m, t, levels), pairs,
                                                                    text_fields, levels, lang), ok, name)
                      for name, m in (("RF", rf), ("RF_null", rf_null))], ignore_index=True)
    t3 = table3(long[long.model == "RF"], n_boot=300, seed=seed)
    t3 = add_null_columns(t3, [null_comparison(long, "RF", "RF_null", n_boot=300, seed=seed)])
    info = dict(counts, before=sex_level_association(train), after=sex_level_association(permuted), n_pairs=len(ok))
    return t3, info


@pytest.fixture(scope="module")
def nothing_planted():
    return _audit(bias_tab=0.0)


def test_permutation_removes_the_association_and_keeps_the_women(nothing_planted):
    _, info = nothing_planted
    assert info["female_share_before"] == info["female_share_after"]
    assert info["n_sex_changed"] > 0.3 * info["n_eligible"] and info["n_eligible"] > 0.9 * info["n_records"]


def test_nothing_planted_nothing_exceeds_the_null(nothing_planted):
    t3, info = nothing_planted
    assert len(t3) == 3 * len(METRICS) and info["n_pairs"] > 500
    assert t3.exceeds_null.notna().sum() > 0.8 * len(t3)        # defined where the metric is
    assert not t3.exceeds_null.fillna(False).any(), t3[t3.exceeds_null.fillna(False)][["condition", "metric", "estimate", "null_estimate"]]


def test_a_large_planted_effect_exceeds_the_null():
    t3, info = _audit(bias_tab=1.5)
    assert info["before"]["cramers_v"] > info["after"]["cramers_v"]
    tab = t3[t3.condition == "tab_iso"].set_index("metric")
    assert bool(tab.loc["PDR", "exceeds_null"]) and bool(tab.loc["female_skew", "exceeds_null"]), tab[["estimate", "null_estimate"]]
