"""`triage-cf`: the command-line entry point (hand-written glue, not a stage), and the shared commands: `reproduce`
(the stage chain), `datasets` and `fetch` (the data root).

The CLI is one module per part of the compendium, as the package is: this module (shared library), `audit.cli` (the
human-triage audit: `metrics`, `swap-text`, `plan`), `margins.cli` (the margin probes) and `tbias.cli` (the
transgender-bias probes); each part's module adds its subcommands through `register(subparsers)`."""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import time

import pandas as pd

from .chain import StageFailed, parse_overrides, reproduce
from .core import data_root, run_dir_for
from .data import dataset_status
from .fetch import AccessNotOpen, fetch_dataset

#: The parts' CLI modules, in the order of their commands in `triage-cf --help`: each defines `register(subparsers)`.
SUBCOMMAND_MODULES = ("audit.cli", "margins.cli", "tbias.cli")


def _cmd_reproduce(args) -> int:
    try:
        overrides = parse_overrides(args.set)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = run_dir_for(args.dataset, args.profile, args.out)
    print(f"triage-cf reproduce: dataset={args.dataset} profile={args.profile} run folder={out}"
          + "".join(f" {k}={v!r}" for k, v in overrides.items()), flush=True)
    t0 = time.perf_counter()
    try:
        reproduce(args.dataset, args.profile, out=out, force=args.force, overrides=overrides)
    except StageFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"done in {time.perf_counter() - t0:.1f} s; report: {out / 'report.html'}")
    return 0


def _cmd_datasets(args) -> int:
    df = dataset_status()
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 60):
        print(df.to_string(index=False))
    return 0


def _cmd_fetch(args) -> int:
    root = args.data_root or data_root()
    try:
        done = fetch_dataset(args.dataset, data_root=root, base_url=args.base_url, progress=args.progress)
    except AccessNotOpen as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not done:
        print(f"{args.dataset}: synthetic dataset, generated from the seed by 01_data; nothing to fetch")
        return 0
    for path, status in done.items():
        print(f"{status:<9} {path}")
    print(f"{args.dataset}: {len(done)} file(s) under {root}, sha256 verified; set TRIAGE_CF_DATA={root} if that is not "
          "your data root")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="triage-cf", description="Counterfactual audit of sex/gender disparities in emergency triage.")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("reproduce", help="run the stage chain for one dataset")
    r.add_argument("--dataset", required=True, help="dataset name (see `triage-cf datasets`)")
    r.add_argument("--profile", default="default", help="smoke | default | paper (or any profile in params/)")
    r.add_argument("--out", default=None, help="run folder (default runs/<dataset>/<profile>/)")
    r.add_argument("--force", action="store_true", help="re-run every stage")
    r.add_argument("--set", action="append", metavar="KEY=VALUE", default=None,
                   help="a parameter over the profile's (VALUE is YAML; repeatable), recorded in run.json, e.g. --set ft_num_processes=2")
    r.set_defaults(func=_cmd_reproduce)
    d = sub.add_parser("datasets", help="list the datasets described in data_manifest/")
    d.set_defaults(func=_cmd_datasets)
    f = sub.add_parser("fetch", help="download an open dataset's files (sha256-verified) into the data root")
    f.add_argument("--dataset", required=True, help="a dataset of data_manifest/ (open ones are downloaded)")
    f.add_argument("--data-root", default=None, help="where to put the files (default: $TRIAGE_CF_DATA, else data/)")
    f.add_argument("--base-url", default=None,
                   help="a mirror's scheme://host[/prefix] replacing the source's (default: $TRIAGE_CF_FETCH_BASE_URL)")
    f.add_argument("--progress", action="store_true", help="show download progress bars")
    f.set_defaults(func=_cmd_fetch)
    for name in SUBCOMMAND_MODULES:
        if importlib.util.find_spec(f"{__package__}.{name}") is not None:
            importlib.import_module(f"{__package__}.{name}").register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
