"""`triage-cf fetch` and `triage-cf plan` (hand-written glue, not a stage): open data in one command, and a plan of a
run's stages, sizes, memory and time before it starts (triage_cf.fetch, triage_cf.plan)."""
from __future__ import annotations

import json
import sys

from .chain import parse_overrides
from .core import data_root
from .fetch import AccessNotOpen, fetch_dataset
from .plan import PlanRefused, format_plan, plan


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


def _cmd_plan(args) -> int:
    try:
        p = plan(args.dataset, args.profile, gpus=args.gpus, gpu_mem_gb=args.gpu_mem, run_dir=args.run_dir, gpu=args.gpu,
                 model=args.model, qlora=True if args.qlora else None, overrides=parse_overrides(args.set))
    except PlanRefused as exc:
        print(format_plan(exc.plan) if not args.json else json.dumps(exc.plan, indent=2, default=str))
        print(f"error: {exc}", file=sys.stderr)
        return 4
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(p, indent=2, default=str) if args.json else format_plan(p))
    return 0


def register(sub) -> None:
    "Add the `fetch` and `plan` subcommands to the `triage-cf` parser's subparsers."
    f = sub.add_parser("fetch", help="download an open dataset's files (sha256-verified) into the data root")
    f.add_argument("--dataset", required=True, help="a dataset of data_manifest/ (open ones are downloaded)")
    f.add_argument("--data-root", default=None, help="where to put the files (default: $TRIAGE_CF_DATA, else data/)")
    f.add_argument("--base-url", default=None,
                   help="a mirror's scheme://host[/prefix] replacing the source's (default: $TRIAGE_CF_FETCH_BASE_URL)")
    f.add_argument("--progress", action="store_true", help="show download progress bars")
    f.set_defaults(func=_cmd_fetch)
    p = sub.add_parser("plan", help="what a run would do and cost (stages, records, tokens, memory, time); runs nothing")
    p.add_argument("--dataset", required=True)
    p.add_argument("--profile", required=True)
    p.add_argument("--gpus", type=int, default=None, help="number of GPUs (default: plan for this machine's CPU)")
    p.add_argument("--gpu-mem", type=float, default=None, help="memory of one GPU in GB (default: the --gpu kind's)")
    p.add_argument("--gpu", default="A100", help="GPU kind for the FLOP-based time (A100, H100, H200, L40S, L4, A10)")
    p.add_argument("--model", default=None, help="a local model folder in place of the profile's ft_model (reads config.json)")
    p.add_argument("--qlora", action="store_true", help="plan QLoRA (4-bit base) fine-tuning; refused on CPU")
    p.add_argument("--run-dir", default=None, help="the run folder whose cached stages to count (default: runs/<dataset>/<profile>)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", default=None,
                   help="a parameter over the profile's, as `triage-cf reproduce --set` (VALUE is YAML; repeatable)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=_cmd_plan)
