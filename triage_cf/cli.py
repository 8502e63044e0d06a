"""`triage-cf`: the command-line entry point (hand-written glue, not a stage)."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def _cmd_reproduce(args) -> int:
    from .chain import StageFailed, reproduce
    from .core import run_dir_for
    out = run_dir_for(args.dataset, args.profile, args.out)
    print(f"triage-cf reproduce: dataset={args.dataset} profile={args.profile} run folder={out}", flush=True)
    t0 = time.perf_counter()
    try:
        reproduce(args.dataset, args.profile, out=out, force=args.force)
    except StageFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"done in {time.perf_counter() - t0:.1f} s; report: {out / 'report.html'}")
    return 0


def _cmd_datasets(args) -> int:
    from .data import dataset_status
    df = dataset_status()
    with __import__("pandas").option_context("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 60):
        print(df.to_string(index=False))
    return 0


def _cmd_metrics(args) -> int:
    from .metrics import metrics_from_csv
    try:
        written = metrics_from_csv(args.pairs, args.out, n_boot=args.n_boot, seed=args.seed, ci_method=args.ci)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, path in written.items():
        print(f"{name}: {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="triage-cf", description="Counterfactual audit of sex/gender disparities in emergency triage.")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("reproduce", help="run the stage chain for one dataset")
    r.add_argument("--dataset", required=True, help="dataset name (see `triage-cf datasets`)")
    r.add_argument("--profile", default="default", help="smoke | default | paper (or any profile in params/)")
    r.add_argument("--out", default=None, help="run folder (default runs/<dataset>/<profile>/)")
    r.add_argument("--force", action="store_true", help="re-run every stage")
    r.set_defaults(func=_cmd_reproduce)
    d = sub.add_parser("datasets", help="list the datasets described in data_manifest/")
    d.set_defaults(func=_cmd_datasets)
    m = sub.add_parser("metrics", help="bias metrics with bootstrap CIs from your own pairs CSV")
    m.add_argument("--pairs", required=True, help="CSV with pair_id, orig_sex (F|M), pred_orig, pred_cf, condition [, true_level, model]")
    m.add_argument("--out", required=True, help="output folder (metrics.csv, and per-level tables when true_level is given)")
    m.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples of pairs (default 1000)")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--ci", choices=["percentile", "bca"], default="percentile", help="bootstrap CI method")
    m.set_defaults(func=_cmd_metrics)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
