"""`triage-cf allocation` and `triage-cf word-association`: analyse answers of the transgender-bias tasks (Hirsch et al.) that
were collected elsewhere, without calling a model (hand-written glue; the analysis is in triage_cf.tbias.allocation and
triage_cf.tbias.words, whose notebooks document the CSV columns)."""
from __future__ import annotations

import sys

import pandas as pd

from .allocation import allocation_from_csv
from .words import word_association_from_csv


def _report(written: dict) -> None:
    for name, path in written.items():
        print(f"{name}: {path}")
    if "issues" in written:
        n = len(pd.read_csv(written["issues"]))
        print(f"note: {n} row(s) counted once, counted as unparsed/invalid or incomplete; see {written['issues']}", file=sys.stderr)


def _analyse(analysis, args) -> int:
    "Run `analysis(answers, out, n_boot, seed)` (an answers CSV in, tables out): 0, or 2 with the error on stderr."
    try:
        written = analysis(args.answers, args.out, n_boot=args.n_boot, seed=args.seed)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    _report(written)
    return 0


def _cmd_allocation(args) -> int:
    return _analyse(allocation_from_csv, args)


def _cmd_word_association(args) -> int:
    return _analyse(word_association_from_csv, args)


def register(subparsers) -> None:
    "Add the `allocation` and `word-association` subcommands to the `triage-cf` parser."
    a = subparsers.add_parser("allocation", help="allocation-task statistics (Hirsch et al. §3) from your own answers CSV")
    a.add_argument("--answers", required=True, help="CSV: model, language, service, condition, pair_id, candidate_1, "
                   "group_1, candidate_2, group_2, response (group: cis | trans; candidate_1 is listed first; each response is "
                   "read as triage_cf.tbias.allocation.parse_choice documents: the <person>/<persona> tag, else a unique name or a stated "
                   "decision; refusals and unparsed answers counted)")
    a.add_argument("--out", required=True, help="output folder (allocation.csv; allocation_issues.csv when rows were excluded)")
    a.add_argument("--n-boot", type=int, default=2000, help="cluster-bootstrap resamples of pairs (default 2000)")
    a.add_argument("--seed", type=int, default=0)
    a.set_defaults(func=_cmd_allocation)
    w = subparsers.add_parser("word-association", help="word-association bias scores (Hirsch et al. §2) from your own answers CSV")
    w.add_argument("--answers", required=True, help="CSV, one row per shown word: model, language, category, iteration, "
                   "word, sentiment (positive | negative), and label (cisgender | transgender) or response (the raw answer, "
                   "read as triage_cf.tbias.words.parse_word_labels documents: lines, lists, markdown tables, lists grouped by label, JSON)")
    w.add_argument("--out", required=True, help="output folder (word_association.csv; word_association_issues.csv when rows were excluded)")
    w.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples of iterations (default 2000)")
    w.add_argument("--seed", type=int, default=0)
    w.set_defaults(func=_cmd_word_association)
