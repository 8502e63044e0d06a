"""Benchmark: the planted-bias recovery study (stage 10_recovery of `--profile calibration`), its measured tables kept.

For each synthetic dataset this runs `triage-cf reproduce --dataset D --profile calibration` into a run folder under
the cache (`RECOVERY_CACHE`, default /tmp/recovery_cache). The stage writes each finished condition's result and skips
it on a rerun, so a stopped benchmark resumes where it was. The study's result tables (recovery_classes,
recovery_power, recovery_runs) then go into benchmarks/results/recovery.json, with the wall and CPU time of the run
(`resumed`: the times cover only what this call ran), the commit and the machine's load. Chapter 10_recovery renders
its measured tables from that file, so a re-run updates the chapter.

    .venv/bin/python benchmarks/recovery.py run synth-fr synth-en   # runs (or resumes) and summarises
    .venv/bin/python benchmarks/recovery.py summarise               # re-reads the run folders
"""
from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
RESULT = REPO / "benchmarks" / "results" / "recovery.json"
CACHE = Path(os.environ.get("RECOVERY_CACHE", "/tmp/recovery_cache"))
TABLES = ("recovery_classes", "recovery_power", "recovery_runs")


def run_dir(dataset: str) -> Path:
    return CACHE / dataset / "calibration"


def run(dataset: str) -> dict:
    "Run (or resume) the calibration profile for `dataset`; its wall and children's CPU seconds."
    resumed = (run_dir(dataset) / "run.json").exists()
    cpu0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run([str(REPO / ".venv" / "bin" / "triage-cf"), "reproduce", "--dataset", dataset, "--profile",
                    "calibration", "--out", str(run_dir(dataset))], check=True, cwd=REPO)
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return dict(resumed=resumed, wall_s=round(time.perf_counter() - t0, 1),
                cpu_s=round(cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime, 1),
                load_avg_after=[round(x, 1) for x in os.getloadavg()])


def read_run(dataset: str) -> dict:
    "The study's result tables of `dataset`'s run folder, as records."
    tables = run_dir(dataset) / "tables"
    missing = [t for t in TABLES if not (tables / f"{t}.csv").exists()]
    if missing:
        raise FileNotFoundError(f"{tables}: no {', '.join(missing)} (run `benchmarks/recovery.py run {dataset}` first)")
    out = {t: json.loads(pd.read_csv(tables / f"{t}.csv").to_json(orient="records")) for t in TABLES}
    meta = json.loads((run_dir(dataset) / "run.json").read_text())
    out["commit"], out["dirty"] = meta["git"].get("commit"), meta["git"].get("dirty")
    return out


def main(argv=None) -> None:
    args = sys.argv[1:] if argv is None else argv
    cmd, datasets = args[0], args[1:] or ["synth-fr", "synth-en"]
    out = json.loads(RESULT.read_text()) if RESULT.exists() else dict(benchmark="recovery", datasets={})
    for d in datasets:
        timing = run(d) if cmd == "run" else out["datasets"].get(d, {}).get("timing")
        out["datasets"][d] = dict(read_run(d), timing=timing)
    out["machine"] = f"{os.cpu_count()} cores, {platform.machine()} (recovery_workers 2; see timing.load_avg_after)"
    RESULT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {RESULT}")


if __name__ == "__main__":
    main()
