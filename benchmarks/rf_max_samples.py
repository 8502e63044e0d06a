"""Benchmark: the RF emulator's cost at scale with a capped bootstrap sample per tree (`rf__max_samples`), side by side.

For a synthetic cohort of N records (default knobs, case mix 1, nothing planted), the TF-IDF + random forest of stage 06
(the hyperparameters the calibration's searches chose at 3,000 and 12,000 records: word 1-2-grams, 200 trees,
max_features 0.05, min_samples_leaf 1) is fitted on the first half and scored on the second, with each tree's bootstrap
sample of the training records (sklearn's default) or capped at 4,000 and 2,000 records. Each variant's fit time is
reported as a ratio to the uncapped fit run in the same process (one thread), with its quadratic weighted kappa on the
held-out half: the cap is worth having where the ratio is large and the kappa does not move.

    .venv/bin/python benchmarks/rf_max_samples.py synth-en 24000      # -> benchmarks/results/rf_max_samples.json
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
RESULT = REPO / "benchmarks" / "results" / "rf_max_samples.json"
PARAMS = dict(tfidf__ngram_range=(1, 2), rf__n_estimators=200, rf__max_features=0.05, rf__min_samples_leaf=1)


def measure(dataset: str, n_records: int, caps=(None, 4000, 2000)) -> dict:
    from sklearn.metrics import cohen_kappa_score
    from threadpoolctl import threadpool_limits
    from triage_cf.audit.baselines import fit_rf_tfidf, proba_by_level, record_texts
    from triage_cf.core import load_params
    from triage_cf.data import load_manifest, load_records
    m = load_manifest(dataset)
    lang, tf = m["language"], list(m.get("text_fields", []))
    knobs = {**load_params(dataset, "default")["synth"], "n_records": int(n_records), "case_mix_by_sex": 1.0,
             "bias_tab": 0.0, "bias_text": 0.0}
    rec, _ = load_records(dataset, seed=5, synth=knobs)
    rec = rec[rec.triage_level.notna() & rec.sex.isin(["F", "M"])].reset_index(drop=True)
    texts, y = record_texts(rec, "full", lang, text_fields=tf), rec.triage_level.astype(int).to_numpy()
    h, levels, rows = len(y) // 2, sorted(set(y)), []
    with threadpool_limits(1):
        for cap in caps:
            p = {**PARAMS, **({"rf__max_samples": cap} if cap else {})}
            t = time.perf_counter()
            rf, _ = fit_rf_tfidf(texts[:h], y[:h], levels, fixed_params=p)
            fit_s = time.perf_counter() - t
            pred = np.array(levels)[proba_by_level(rf, texts[h:], levels).argmax(1)]
            rows.append(dict(max_samples=cap, fit_s=round(fit_s, 1),
                             kappa_w=round(float(cohen_kappa_score(y[h:], pred, weights="quadratic")), 3)))
            print(rows[-1], flush=True)
    base = rows[0]["fit_s"]
    for r in rows:
        r["fit_ratio_to_uncapped"] = round(r["fit_s"] / base, 3)
    return dict(dataset=dataset, n_records=int(n_records), n_train=int(h), params={k: str(v) for k, v in PARAMS.items()},
                variants=rows, machine=f"{os.cpu_count()} cores, {platform.machine()}, one thread, other runs beside it")


def main(argv=None) -> None:
    args = sys.argv[1:] if argv is None else argv
    out = json.loads(RESULT.read_text()) if RESULT.exists() else dict(benchmark="rf_max_samples", runs=[])
    run = measure(args[0], int(args[1]))
    out["runs"] = [r for r in out["runs"] if (r["dataset"], r["n_records"]) != (run["dataset"], run["n_records"])] + [run]
    RESULT.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
