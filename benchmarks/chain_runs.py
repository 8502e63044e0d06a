"""Benchmark record: what whole chain runs decided (issue 37's check on nothing-planted 12,000-record cohorts).

Reads the run folders `triage-cf reproduce` wrote and appends one record per run to a results JSON: the dataset, the
run's parameters (`run.json`: seed, synth knobs, commit), each model's fitness verdict (`tables/fitness.csv`), its primary
check (`tables/null_test.csv`: estimate, effect, p, the test that decided, MDE, finding) and its count of secondary
findings. A synthetic cohort with nothing planted has no bias to find, so every finding of a fit model is a false one.

    .venv/bin/python benchmarks/chain_runs.py record RUN_DIR [RUN_DIR ...] --note "how the seeds were drawn"

Default output: benchmarks/results/chain_runs.json (a run already recorded, same folder name and seed, is replaced).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
RESULT = REPO / "benchmarks" / "results" / "chain_runs.json"


def run_record(run: Path) -> dict:
    "One run folder's decisions (see the module's docstring); a clear error when a table is missing."
    need = [run / "run.json", run / "tables" / "fitness.csv", run / "tables" / "null_test.csv"]
    missing = [str(p) for p in need if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"{run}: not a finished audit run, missing {', '.join(missing)}")
    meta = json.loads(need[0].read_text())
    fit = pd.read_csv(need[1]).set_index("model")
    nt = pd.read_csv(need[2])
    models = []
    for m, g in nt.groupby("model", sort=False):
        p = g[g.check == "primary"].iloc[0]
        sec = g[(g.check == "secondary") & (g.finding == True)]   # noqa: E712 (a boolean column read from CSV)
        models.append(dict(model=m, kappa_w=float(fit.loc[m, "kappa_w"]), n_test=int(fit.loc[m, "n_test"]),
                           fit_for_audit=bool(fit.loc[m, "fit_for_audit"]), primary_estimate=float(p.estimate),
                           primary_effect=float(p.effect), primary_p=float(p.p), primary_test=str(p.p_method),
                           primary_mde=float(p.mde), primary_finding=bool(p.finding == True),   # noqa: E712
                           secondary_findings=int(len(sec)),
                           secondary_which=[f"{r.condition}/{r.metric}" for r in sec.itertuples()]))
    params = meta.get("parameters", {})
    return dict(run=run.name, dataset=meta.get("dataset"), profile=meta.get("profile"), seed=params.get("seed"),
                synth=params.get("synth"), commit=(meta.get("git") or {}).get("commit"), models=models,
                fit_primary_findings=sum(m["primary_finding"] for m in models if m["fit_for_audit"]),
                fit_secondary_findings=sum(m["secondary_findings"] for m in models if m["fit_for_audit"]))


def record(runs: list[Path], note: str, path: Path = RESULT) -> dict:
    "Append the runs' records to `path` (replacing a run recorded before under the same name and seed)."
    out = json.loads(path.read_text()) if path.exists() else dict(benchmark="chain_runs", runs=[])
    new = [dict(run_record(r), recorded=dt.date.today().isoformat(), note=note) for r in runs]
    keep = [r for r in out["runs"] if (r["run"], r["seed"]) not in {(n["run"], n["seed"]) for n in new}]
    out["runs"] = keep + new
    path.write_text(json.dumps(out, indent=1) + "\n")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("runs", nargs="+", type=Path)
    r.add_argument("--note", default="")
    r.add_argument("--out", type=Path, default=RESULT)
    args = ap.parse_args(argv)
    out = record(args.runs, args.note, args.out)
    for x in out["runs"][-len(args.runs):]:
        print(f"{x['run']}: fit models' primary findings {x['fit_primary_findings']}, "
              f"secondary findings {x['fit_secondary_findings']}")


if __name__ == "__main__":
    main()
