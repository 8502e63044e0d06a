"""Benchmark: `triage-cf plan`'s CPU estimate against a measured run at the paper's sizes, stage by stage.
Writes benchmarks/results/plan_paper_cpu.json.

    .venv/bin/python benchmarks/plan_paper_cpu.py --run RUN_FOLDER [--out benchmarks/results/plan_paper_cpu.json]

RUN_FOLDER is a finished run of the `paper` profile on this CPU, e.g. the synth-en run with stand-ins for the models
that cannot train at their paper size on 2 cores (README, "The paper profile on a CPU"):

    triage-cf reproduce --dataset synth-en --profile paper --set ft_model=tiny-llama --set ft_num_processes=2 \\
        --set fs_profile=default --set baseline_threads=2 --set mlp_max_pairs=2000

The parameters that differ from the profile's are read back from the run's run.json and given to `plan` as the same
overrides; the measured seconds are the chain's per-stage wall times there. Unlike benchmarks/plan_estimate.py (the
`make reproduce` target), none of the CPU_MEASURED constants comes from this run: it tests the plan's extrapolation
from the 3,000-visit default cohorts to a 76,000-visit cohort. Speed is measured here, never asserted in tests.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

from triage_cf.core import load_params, write_json
from triage_cf.audit.plan import plan


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", required=True, help="a finished run folder (its run.json)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "plan_paper_cpu.json"))
    a = ap.parse_args(argv)
    run = json.loads((Path(a.run) / "run.json").read_text())
    dataset, profile = run["dataset"], run["profile"]
    base, missing = load_params(dataset, profile), object()
    overrides = {k: v for k, v in run["parameters"].items() if base.get(k, missing) != v}
    stages = run["stages"]
    failed = [s for s, r in stages.items() if r.get("status") != "ok"]
    if failed:
        raise SystemExit(f"{a.run}: stages {failed} did not finish ok; nothing to compare")
    p = plan(dataset, profile, run_dir="/nonexistent", overrides=overrides, strict=False)
    est = {r["stage"]: r["seconds"] for r in p["stages"]}
    meas = {s: r["wall_s"] for s, r in stages.items()}
    rows = {s: {"estimated_s": round(est[s], 1), "measured_s": round(meas[s], 1), "ratio": round(est[s] / meas[s], 3)}
            for s in meas if est.get(s) is not None}
    total_e, total_m = sum(r["estimated_s"] for r in rows.values()), sum(r["measured_s"] for r in rows.values())
    res = {"what": f"triage-cf plan's CPU estimate vs the measured {dataset} run of the {profile} profile (stages' wall seconds)",
           "dataset": dataset, "profile": profile, "overrides": overrides, "run_commit": run.get("git"),
           "estimated_s": round(total_e, 1), "measured_s": round(total_m, 1), "ratio": round(total_e / total_m, 3),
           "stages": rows, "workload": p["workload"], "sizes": p["sizes"],
           "machine": {"cpu_count": os.cpu_count(), "loadavg_now": [round(x, 2) for x in os.getloadavg()],
                       "platform": platform.platform()}}
    write_json(a.out, res)
    for s, r in rows.items():
        print(f"{s:<20} estimated {r['estimated_s']:>8.0f} s  measured {r['measured_s']:>8.0f} s  ratio {r['ratio']:.2f}")
    print(f"total: estimated {total_e:.0f} s, measured {total_m:.0f} s, ratio {total_e / total_m:.2f}; wrote {a.out}")
    return res


if __name__ == "__main__":
    main()
