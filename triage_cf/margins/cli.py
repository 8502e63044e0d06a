"""`triage-cf probe-margins`: the token-margin probes of YentlGuard (stages 11_margins_vignettes, 12_margins_probe) as one command
(hand-written glue, not a stage).

`triage-cf probe-margins --dataset NAME --out DIR` runs the chain stages of the profile (default `margins-cpu`: the
offline SmolLM2-135M-Instruct on the local backend, so the bare command works on a fresh install) through
`triage_cf.chain.reproduce`. `--backend`, `--model` and `--base-url` point the same stage at a local model folder, a vLLM
model or any OpenAI-compatible server (API key from the environment variable OPENAI_API_KEY only); they become the
stage parameters `pm_backend`, `pm_model` and `pm_base_url` of the run (recorded in run.json).

`triage-cf triager --yentlbench DIR --out DIR` (or `--probe-run RUN`) runs YentlBench's decision audit of the written
level (`nbs/2_margins/02_triager.ipynb`) on a folder of YentlBench `*.run.json` files (or on a chain run's probe rows),
writing one CSV per analysis under `tables/`, two figures under `figures/` and the answer table under `data/`.

`triage-cf margins --answers FILE --out DIR` analyses margins computed elsewhere (an answers file: JSON lines, one per
vignette x variant x branch, the format the stage writes to `data/margins_answers.jsonl`) into the stage's tables,
figures and DuckDB rows; a malformed line is refused with its line number.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

import pandas as pd

from ..chain import StageFailed, reproduce
from ..core import run_dir_for, sha256_file, write_table
from ..data import load_manifest
from .probe import MarginStore, ProbeSettings, analyse_answers, write_margin_outputs
from .triager import answers_from_probe, audit_answers, audit_yentlbench, write_triager_outputs

#: Stage parameters set by the command's options.
OPTION_PARAMS = {"backend": "pm_backend", "model": "pm_model", "base_url": "pm_base_url"}


def overrides_from(args: argparse.Namespace) -> dict:
    "The stage parameters the options set (options not given are left to the profile)."
    out = {p: getattr(args, a) for a, p in OPTION_PARAMS.items() if getattr(args, a, None) is not None}
    if out.get("pm_backend") == "openai" and not (out.get("pm_base_url") and out.get("pm_model")):
        raise ValueError("--backend openai needs --base-url (e.g. http://127.0.0.1:8000/v1) and --model (the served model's name)")
    return out


def _cmd_probe_margins(args) -> int:
    try:
        overrides = overrides_from(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = run_dir_for(args.dataset, args.profile, args.out)
    print(f"triage-cf probe-margins: dataset={args.dataset} profile={args.profile} run folder={out}"
          + (f" parameters={overrides}" if overrides else ""), flush=True)
    t0 = time.perf_counter()
    try:
        reproduce(args.dataset, args.profile, out=out, force=args.force, overrides=overrides or None)
    except StageFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"done in {time.perf_counter() - t0:.1f} s; report: {out / 'report.html'}; store: {out / 'data' / 'margins.duckdb'}")
    return 0


def register(subparsers) -> None:
    "Add the `probe-margins` subcommand to the `triage-cf` parser."
    p = subparsers.add_parser("probe-margins", help="token-margin probes of an LLM's own triage (YentlGuard: ΔM, gate, CRR, "
                              "sycophancy gap, TAR)", description=__doc__.split("\n\n")[1] if __doc__ else None)
    p.add_argument("--dataset", required=True, help="dataset name (data_manifest/<name>.yaml)")
    p.add_argument("--backend", choices=["local", "vllm", "openai"], default=None,
                   help="LLM backend (default: the profile's, local)")
    p.add_argument("--model", default=None, help="smollm2, a local model folder, or the served model name (openai)")
    p.add_argument("--base-url", dest="base_url", default=None, help="OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--out", required=True, help="run folder")
    p.add_argument("--profile", default="margins-cpu", help="profile of params/profiles.yaml (default: margins-cpu)")
    p.add_argument("--force", action="store_true", help="re-run every stage")
    p.set_defaults(func=_cmd_probe_margins)
    register_margins(subparsers)
    register_triager(subparsers)


# --- `triage-cf margins --answers FILE`: margins computed elsewhere -------------------------------------------------------

def _scale_from(args) -> dict:
    "The triage scale: the dataset manifest's (`--dataset`), else `--scale-name`, `--levels`, `--most-severe`."
    if args.dataset:
        return load_manifest(args.dataset)["triage_scale"]
    try:
        levels = [int(x) for x in str(args.levels).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--levels must be comma-separated integers, got {args.levels!r}") from None
    if len(levels) < 2 or int(args.most_severe) not in levels:
        raise ValueError(f"--levels {levels} needs at least two levels, including --most-severe {args.most_severe}")
    return {"name": args.scale_name, "levels": levels, "most_severe": int(args.most_severe)}


def _cmd_margins(args) -> int:
    answers, out = Path(args.answers), Path(args.out)
    if not answers.is_file():
        print(f"error: answers file {answers} not found", file=sys.stderr)
        return 2
    try:
        scale = _scale_from(args)
        st = ProbeSettings(scale=scale, gate_threshold=float(args.threshold), min_degradation=float(args.min_degradation))
        sha = sha256_file(answers)
        eid = "answers-" + sha[:12]
        meta = {"experiment_id": eid, "created_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                "backend": "answers", "mode": "answers", "fingerprint": json.dumps({"answers_sha256": sha}),
                "settings": json.dumps({"scale": scale, "gate_threshold": st.gate_threshold, "min_degradation": st.min_degradation,
                                        "n_boot": args.n_boot, "seed": args.seed}, sort_keys=True)}
        if args.model:
            meta["model"] = args.model
        with MarginStore(out / "data" / "margins.duckdb") as store:
            run = analyse_answers(answers, st, store, meta)
            vm, bm, calls = (store.table(t, eid) for t in ("vignette_metrics", "branch_metrics", "calls"))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    model, budget = str(meta.get("model") or "answers"), str(meta.get("budget") or "none")
    write_table(pd.DataFrame([{"backend": "answers", "model": model, "delta_m_source": "answers file", "budget": budget,
                               "answers_sha256": sha[:12], "gate_threshold": st.gate_threshold, "min_degradation": st.min_degradation,
                               "n_vignettes": run.n_vignettes, "n_calls": run.n_calls, "n_gate_fired": run.n_gate_fired,
                               "remark": f"margins computed elsewhere ({answers.name}), analysed by triage-cf margins"}]),
                out / "tables", "margins_experiment")
    write_margin_outputs(vm, bm, calls, scale, out / "tables", out / "figures", st.gate_threshold, args.n_boot, args.seed, budget, model)
    print(f"triage-cf margins: {run.n_vignettes} vignettes, {run.n_calls} calls, gate fired on {run.n_gate_fired} variant(s); "
          f"tables: {out / 'tables'}; store: {out / 'data' / 'margins.duckdb'} (experiment {eid})")
    return 0


def register_margins(subparsers) -> None:
    "Add the `margins` subcommand (analyse an answers file) to the `triage-cf` parser."
    p = subparsers.add_parser("margins", help="analyse margins computed elsewhere (YentlGuard): the stage's tables, figures and "
                              "DuckDB rows from an answers file", description="Analyse an answers file (JSON lines, one per "
                              "vignette x variant x branch; format in nbs/2_margins/01_probe.ipynb) as stage 12_margins_probe does.")
    p.add_argument("--answers", required=True, help="answers file (JSON lines), e.g. a run's data/margins_answers.jsonl")
    p.add_argument("--out", required=True, help="output folder (tables/, figures/, data/margins.duckdb)")
    p.add_argument("--dataset", default=None, help="take the triage scale from this dataset's manifest")
    p.add_argument("--scale-name", dest="scale_name", default="ESI", help="scale name, the answers' JSON key (default ESI)")
    p.add_argument("--levels", default="1,2,3,4,5", help="the scale's levels (default 1,2,3,4,5)")
    p.add_argument("--most-severe", dest="most_severe", type=int, default=1, help="the most severe level (default 1)")
    p.add_argument("--threshold", type=float, default=1.0, help="gate threshold, nats (default 1.0)")
    p.add_argument("--min-degradation", dest="min_degradation", type=float, default=0.1, help="CRR's δ_min, nats (default 0.1)")
    p.add_argument("--n-boot", dest="n_boot", type=int, default=1000, help="cluster-bootstrap resamples (default 1000)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--model", default=None, help="model name of the tables (default: the file's `model` field)")
    p.set_defaults(func=_cmd_margins)


# --- `triage-cf triager`: the decision audit of YentlBench's runs or of a probe run ----------------------------------------

def _probe_answers(run: Path, level: str = "written") -> pd.DataFrame:
    """The answer table of a chain run's probe rows (data/margins.duckdb; chief complaints from data/vignettes.csv),
    of the written or the decided level."""
    db = run / "data" / "margins.duckdb"
    if not db.is_file():
        raise ValueError(f"{db} not found: run the margins stages first (triage-cf probe-margins)")
    with MarginStore(db) as store:
        exp = store.table("experiments")
        if exp.empty:
            raise ValueError(f"{db}: no experiment")
        last = exp.sort_values("created_utc").iloc[-1]
        vm = store.table("vignette_metrics", last["experiment_id"])
    vig_path = run / "data" / "vignettes.csv"
    vig = pd.read_csv(vig_path, dtype={"vignette_id": str}) if vig_path.is_file() else None
    return answers_from_probe(vm, str(last["model"]), vig, level=level)


def _cmd_triager(args) -> int:
    out = Path(args.out)
    try:
        if args.yentlbench:
            answers, tables = audit_yentlbench(args.yentlbench, n_boot=args.n_boot, seed=args.seed,
                                               check=not args.no_check)
        else:
            answers = _probe_answers(Path(args.probe_run), args.level)
            tables = audit_answers(answers, n_boot=args.n_boot, seed=args.seed)
    except ValueError as exc:
        hint = " (a model that writes no level: --level decided)" if args.probe_run and args.level == "written" else ""
        print(f"error: {exc}{hint}", file=sys.stderr)
        return 2
    write_table(answers, out / "data", "triager_answers")
    write_triager_outputs(tables, out / "tables", out / "figures", prefix="triager")
    ex = tables["exclusions"]
    print(f"triage-cf triager: {answers['model'].nunique()} model(s), {len(answers)} answers, "
          f"{int((answers['parse_status'] != 'ok').sum())} without a usable level; "
          f"{int(ex['excluded_model'].sum())} model(s) excluded; tables: {out / 'tables'}; figures: {out / 'figures'}")
    return 0


def register_triager(subparsers) -> None:
    "Add the `triager` subcommand (YentlBench's decision audit) to the `triage-cf` parser."
    p = subparsers.add_parser("triager", help="an LLM as the triager: YentlBench's decision audit of the written level "
                              "(their runs, or a chain run's probe rows)",
                              description="Decision audit of the written level (nbs/2_margins/02_triager.ipynb).")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--yentlbench", default=None, help="folder of YentlBench *.run.json files")
    src.add_argument("--probe-run", dest="probe_run", default=None, help="a chain run folder (data/margins.duckdb)")
    p.add_argument("--out", required=True, help="output folder (tables/, figures/, data/)")
    p.add_argument("--no-check", dest="no_check", action="store_true",
                   help="do not match the vignettes against the chain's (mimic-iv-ed-demo under the data root)")
    p.add_argument("--level", choices=["written", "decided"], default="written",
                   help="--probe-run: audit the written level (YentlBench's, default) or the level decided after the "
                        "answer prefix (a model that writes no level, e.g. SmolLM2-135M)")
    p.add_argument("--n-boot", dest="n_boot", type=int, default=1000, help="cluster-bootstrap resamples (default 1000)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.set_defaults(func=_cmd_triager)
