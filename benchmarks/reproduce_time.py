"""Benchmark: how long `make reproduce` (default profile, synth-en then synth-fr, every stage) takes on a fresh clone, and
how well `triage-cf plan` predicts it on the CPU it ran on. Appends one measurement to
benchmarks/results/reproduce_time.json.

    .venv/bin/python benchmarks/reproduce_time.py run               # clone HEAD, probe the idle CPU, make reproduce, record
    .venv/bin/python benchmarks/reproduce_time.py record --runs DIR --elapsed S --commit SHA --gflops G

`run` needs the machine idle (nothing else running: the figure is a wall time on 2 cores). It clones the repository's
HEAD into a temporary folder, links this checkout's installed `.venv` (the install is not timed) and puts the clone
first on PYTHONPATH, so the chain runs the clone's code, writes its run folders inside the clone and times
`make reproduce` from the start of the first stage to the last report. The CPU's fp32 rate is probed before the run
(`triage_cf.audit.plan.cpu_fp32_gflops`). `record` files a run made by hand: `--runs` is the clone's `runs/` folder, and it must be run from a checkout
at the measured commit (the plan it records is this checkout's: its profile and its rates).

Each record: the commit, the date, the probe, the elapsed wall time, each stage's wall seconds (run.json), and the plan
of the same profile at the development machine's rates and scaled by `cpu_speed_ratio` (the ratio of measured to scaled
is what `plan` gets wrong on that CPU). Target of the issue: at most 20 minutes on 2 idle cores.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULT = REPO / "benchmarks" / "results" / "reproduce_time.json"
DATASETS = ("synth-en", "synth-fr")
BUDGET_S = 20 * 60


def measured_stage_seconds(runs: Path) -> dict:
    "{dataset: {stage: wall seconds}} from each default run folder's run.json under `runs`."
    out = {}
    for d in DATASETS:
        rj = runs / d / "default" / "run.json"
        if not rj.is_file():
            raise FileNotFoundError(f"{rj}: no run.json (did make reproduce finish for {d}?)")
        st = json.loads(rj.read_text())["stages"]
        out[d] = {s: round(float(v["wall_s"]), 1) for s, v in st.items() if v.get("status") == "ok"}
    return out


def measurement(runs: Path, elapsed_s: float, commit: str, gflops: float, load_avg: tuple | None = None) -> dict:
    "One record: measured stage times, the plan at the development machine's rates and scaled to this CPU."
    from triage_cf.audit.plan import DEV_FP32_GFLOPS, cpu_speed_ratio, plan
    measured = measured_stage_seconds(runs)
    ratio = cpu_speed_ratio(gflops)
    per = {}
    for d in DATASETS:
        p = plan(d, "default", run_dir="/nonexistent")   # every stage runs, as in the measurement
        m = sum(measured[d].values())
        per[d] = {"measured_s": round(m, 1), "stages_measured_s": measured[d],
                  "estimated_dev_s": round(p["seconds"], 1), "estimated_here_s": round(p["seconds"] * ratio, 1),
                  "measured_over_estimated_here": round(m / (p["seconds"] * ratio), 3)}
    stages_total = sum(v["measured_s"] for v in per.values())
    est_here = sum(v["estimated_here_s"] for v in per.values())
    return {"commit": commit, "date": dt.date.today().isoformat(), "elapsed_s": round(float(elapsed_s), 1),
            "stages_s": round(stages_total, 1), "within_budget": float(elapsed_s) <= BUDGET_S,
            "fp32_gflops": round(float(gflops), 1), "dev_fp32_gflops": DEV_FP32_GFLOPS, "speed_ratio": round(ratio, 3),
            "estimated_dev_s": round(sum(v["estimated_dev_s"] for v in per.values()), 1),
            "estimated_here_s": round(est_here, 1), "measured_over_estimated_here": round(stages_total / est_here, 3),
            "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "load_avg_after_run": load_avg},
            "datasets": per}


def append(rec: dict, path: Path = RESULT) -> dict:
    "Add `rec` to the results file (one entry per commit and date: a re-measurement replaces its entry)."
    res = json.loads(path.read_text()) if path.is_file() else {
        "what": "make reproduce (default profile, synth-en + synth-fr) on a fresh clone: wall time and triage-cf plan's "
                "estimate at the development machine's rates and scaled to the CPU's fp32 probe",
        "budget_s": BUDGET_S, "runs": []}
    res["runs"] = [r for r in res["runs"] if (r["commit"], r["date"]) != (rec["commit"], rec["date"])] + [rec]
    path.write_text(json.dumps(res, indent=1) + "\n")
    return res


def cmd_run(args) -> dict:
    from triage_cf.audit.plan import cpu_fp32_gflops
    if os.getloadavg()[0] > 0.5:
        print(f"warning: load average {os.getloadavg()[0]:.2f}: the machine is not idle, the time will be too long",
              file=sys.stderr)
    gflops = cpu_fp32_gflops()
    commit = subprocess.check_output(["git", "-C", str(REPO), "rev-parse", "HEAD"], text=True).strip()
    with tempfile.TemporaryDirectory(prefix="reproduce_time_") as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        (clone / ".venv").symlink_to(REPO / ".venv")
        env = {**os.environ, "PYTHONPATH": str(clone), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        env.setdefault("TRIAGE_CF_DATA", str(REPO.parent / "shared" / "data"))
        t0 = time.perf_counter()
        subprocess.run(["make", "reproduce"], cwd=clone, env=env, check=True)
        rec = measurement(clone / "runs", time.perf_counter() - t0, commit, gflops, os.getloadavg())
    append(rec)
    return rec


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("run", help="clone HEAD, probe the idle CPU, time make reproduce, record")
    r = sub.add_parser("record", help="record a make reproduce run made by hand")
    r.add_argument("--runs", required=True, help="the clone's runs/ folder")
    r.add_argument("--elapsed", type=float, required=True, help="make reproduce's wall seconds")
    r.add_argument("--commit", required=True, help="the commit the clone was at")
    r.add_argument("--gflops", type=float, required=True, help="cpu_fp32_gflops() on the idle machine")
    a = ap.parse_args(argv)
    rec = cmd_run(a) if a.cmd == "run" else append(measurement(Path(a.runs), a.elapsed, a.commit, a.gflops))["runs"][-1]
    print(f"make reproduce at {rec['commit'][:7]}: {rec['elapsed_s'] / 60:.1f} min (budget {BUDGET_S // 60} min); "
          f"plan: {rec['estimated_dev_s'] / 60:.1f} min at the development machine's rates, "
          f"{rec['estimated_here_s'] / 60:.1f} min scaled to this CPU ({rec['fp32_gflops']} GFLOP/s); "
          f"stages measured / scaled estimate = {rec['measured_over_estimated_here']}")


if __name__ == "__main__":
    main()
