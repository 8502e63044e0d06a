"""`triage-cf probe-margins`: the token-margin probes of seed 001 (stages 10_vignettes, 11_margins) as one command
(hand-written glue, not a stage).

`triage-cf probe-margins --dataset NAME --out DIR` runs the chain stages of the profile (default `margins-cpu`: the
offline SmolLM2-135M-Instruct on the local backend, so the bare command works on a fresh install) through
`triage_cf.chain.reproduce`. `--backend`, `--model` and `--base-url` point the same stage at a local model folder, a vLLM
model or any OpenAI-compatible server (API key from the environment variable OPENAI_API_KEY only); they become the
stage parameters `pm_backend`, `pm_model` and `pm_base_url` of the run (recorded in run.json).
"""
from __future__ import annotations

import argparse
import sys
import time

from .chain import StageFailed, reproduce
from .core import run_dir_for

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
    p = subparsers.add_parser("probe-margins", help="token-margin probes of an LLM's own triage (seed 001: ΔM, gate, CRR, "
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
