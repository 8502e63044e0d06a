"""Benchmark: the CPU time `triage-cf plan` estimates for `make reproduce` (default profile, synth-en then
synth-fr, every stage) against the time measured on the development machine. Writes benchmarks/results/plan.json.

    .venv/bin/python benchmarks/plan_estimate.py [--out benchmarks/results/plan.json]

The measured time is the README's ("Performance"): `make reproduce` of commit 5b5aaee run on the idle 2-core machine
on 2026-12-01 (a clone, nothing else running; per-stage wall seconds from each run folder's run.json): 23 min 20 s,
synth-en 586 s and synth-fr 814 s. Target: the estimate is within a factor 1.5 of the measured time.

What the comparison tests: 05_emulator and the FT part of 08_predict (the LLM) are estimated from throughputs (LoRA
tokens/s; scoring tokens/s of benchmarks/results/inference.json) and measured prompt lengths, independently of this
run; the baselines of 06_baselines and their pair scoring in 08_predict, 09_metrics and the light stages use
per-record, per-text and per-stage costs taken from this run and the one before it (triage_cf.audit.plan.CPU_MEASURED
says which), so they match by construction up to the estimated cohort size and the mean of the two runs.
"""
from __future__ import annotations

import argparse
import os
import platform
from pathlib import Path

from triage_cf.core import write_json
from triage_cf.audit.plan import CPU_MEASURED, PROMPT_TOKENS, plan

#: make reproduce of commit 5b5aaee on the idle 2-core machine, 2026-12-01 (run.json wall seconds per stage).
MEASURED = {"synth-en": {"01_data": 11.0, "02_cohort": 7.8, "03_split": 10.6, "04_null_control": 8.9, "05_emulator": 129.4,
                         "06_baselines": 176.4, "07_counterfactuals": 11.9, "08_predict": 188.4, "09_metrics": 23.2,
                         "15_report": 13.3},
            "synth-fr": {"01_data": 12.1, "02_cohort": 8.7, "03_split": 9.3, "04_null_control": 9.3, "05_emulator": 216.3,
                         "06_baselines": 231.4, "07_counterfactuals": 10.8, "08_predict": 273.5, "09_metrics": 23.1,
                         "15_report": 12.4}}
for _m in MEASURED.values():
    _m["total"] = sum(_m.values())
MEASURED_TOTAL = sum(m["total"] for m in MEASURED.values())   # 1,400 s; the chain itself printed 586 + 814 s


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "plan.json"))
    a = ap.parse_args(argv)
    per = {}
    for d, meas in MEASURED.items():
        p = plan(d, "default", run_dir="/nonexistent")  # an empty run folder: every stage runs, as in the measurement
        stages = {r["stage"]: round(r["seconds"], 1) for r in p["stages"]}
        per[d] = {"estimated_s": round(p["seconds"], 1), "measured_s": meas["total"],
                  "ratio": round(p["seconds"] / meas["total"], 3), "stages_estimated_s": stages,
                  "stages_measured_s": {k: v for k, v in meas.items() if k != "total"},
                  "stage_ratios": {k: round(stages[k] / v, 3) for k, v in meas.items() if k != "total"},
                  "llm_stages_ratio": round((stages["05_emulator"] + stages["08_predict"]) / (meas["05_emulator"] + meas["08_predict"]), 3),
                  "workload": {k: p["workload"][k] for k in ("ft_train", "ft_val", "epochs", "ft_eval", "eval_views", "pairs", "all_pairs",
                                                             "mlp_pairs", "null_twins", "train_tokens", "val_tokens",
                                                             "eval_tokens", "pair_tokens", "baseline_train")},
                  "sizes": p["sizes"]}
    total = sum(v["estimated_s"] for v in per.values())
    res = {
        "what": "triage-cf plan's CPU estimate of `make reproduce` (default profile, synth-en + synth-fr) vs measured",
        "estimated_s": round(total, 1), "measured_s": MEASURED_TOTAL, "ratio": round(total / MEASURED_TOTAL, 3),
        "target": "ratio within [1/1.5, 1.5]", "within_target": 1 / 1.5 <= total / MEASURED_TOTAL <= 1.5,
        "datasets": per,
        "measured_source": "make reproduce of commit 5b5aaee (default profile, both synthetic cohorts) on the idle 2-core "
                           "development machine, 2026-12-01, in a clone with nothing else running: 586 s (synth-en) + 814 s "
                           "(synth-fr); per-stage wall seconds from the run folders' run.json",
        "estimate_basis": {"cpu_measured": CPU_MEASURED, "prompt_tokens": {d: PROMPT_TOKENS[d] for d in MEASURED},
                           "independent_of_the_measured_run": ["05_emulator", "08_predict (FT pairs)"],
                           "taken_from_the_measured_runs": ["06_baselines (per training record and model)",
                                                            "08_predict (FS, RF, MLP: per pair text)", "09_metrics",
                                                            "light stages (mean)"]},
        "machine": {"cpu_count": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()], "platform": platform.platform()},
    }
    write_json(a.out, res)
    for d, v in per.items():
        print(f"{d}: estimated {v['estimated_s']:.0f} s, measured {v['measured_s']:.0f} s (ratio {v['ratio']:.2f}; "
              f"LLM stages {v['llm_stages_ratio']:.2f})")
    print(f"make reproduce: estimated {total:.0f} s, measured {MEASURED_TOTAL:.0f} s, ratio {total / MEASURED_TOTAL:.2f}; wrote {a.out}")
    return res


if __name__ == "__main__":
    main()
