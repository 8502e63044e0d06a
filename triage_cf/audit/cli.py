"""`triage-cf metrics`, `triage-cf swap-text`, `triage-cf plan` and `triage-cf compare`: the human-triage audit's commands (hand-written
glue, not a stage): the bias metrics and the permutation test on your own predictions (triage_cf.audit.metrics), the
counterfactual function g on your own notes (triage_cf.rewrite, triage_cf.audit.rewrite_llm), and a plan of a run's stages,
sizes, memory and time before it starts (triage_cf.audit.plan), and finished runs side by side (triage_cf.audit.compare)."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from ..chain import parse_overrides
from .compare import CannotCompare, compare_runs
from .metrics import metrics_from_csv
from .plan import PlanRefused, detectable_size, format_plan, plan
from ..rewrite import SexSpecificContent
from .rewrite_llm import default_rewrite_cache, make_rewriter, swap_text, swap_tsv


def _cmd_metrics(args) -> int:
    try:
        written = metrics_from_csv(args.pairs, args.out, n_boot=args.n_boot, seed=args.seed, ci_method=args.ci,
                                   kappa_w=tuple(args.kappa_w) if args.kappa_w else None,
                                   baseline_kappa=args.baseline_kappa, kappa_floor=args.kappa_floor,
                                   baseline_margin=args.baseline_margin, null_csvs=args.null or (), alpha=args.alpha)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, path in written.items():
        print(f"{name}: {path}")
    return 0


def _cmd_compare(args) -> int:
    try:
        written = compare_runs(args.runs, args.out)
    except CannotCompare as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for kind, path in written.items():
        print(f"{kind}: {path}")
    return 0


def _cmd_swap_text(args) -> int:
    try:
        rewriter = None
        if args.method == "llm":
            if args.backend == "openai" and not (args.base_url and args.model):
                print("error: --backend openai needs --base-url (e.g. http://localhost:8000/v1) and --model (the served "
                      "model's name)", file=sys.stderr)
                return 2
            rewriter = make_rewriter(args.lang, model=args.model or "smollm2", backend=args.backend, base_url=args.base_url,
                                     cache=Path(args.cache) if args.cache else default_rewrite_cache(),
                                     n_shots=args.n_shots, batch_size=args.batch_size)
        elif any(v is not None for v in (args.model, args.base_url, args.cache, args.n_shots)) or args.backend != "local":
            print("error: --model/--backend/--base-url/--cache/--n-shots apply to --method llm only", file=sys.stderr)
            return 2
        if args.file:
            if args.text:
                print("error: give either TEXT or --file, not both", file=sys.stderr)
                return 2
            out = args.out or "-"
            if out == "-":
                with tempfile.TemporaryDirectory() as d:
                    tmp = Path(d) / "out.tsv"
                    swap_tsv(args.file, args.column, args.lang, args.to, tmp, method=args.method, rewriter=rewriter)
                    sys.stdout.write(tmp.read_text(encoding="utf-8"))
            else:
                df = swap_tsv(args.file, args.column, args.lang, args.to, out, method=args.method, rewriter=rewriter)
                counts = df["swap_status"].value_counts().to_dict()
                print(f"wrote {out}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), file=sys.stderr)
        elif not args.text:
            print("error: give TEXT or --file IN.tsv", file=sys.stderr)
            return 2
        else:
            print(swap_text(" ".join(args.text), args.lang, args.to, method=args.method, rewriter=rewriter))
        if rewriter is not None:
            st = rewriter.stats
            print(f"llm g ({args.backend}, {rewriter.prompt_version}): {st['sent']} model call(s), {st['cache_hits']} "
                  f"cached answer(s), {st['seconds']:.1f} s", file=sys.stderr)
        return 0
    except (SexSpecificContent, ValueError, KeyError, FileNotFoundError, ImportError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


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
    if args.detect is not None:
        print(detect_sentence(args.detect, args.case_mix, args.detect_model))
    return 0


def detect_sentence(points: float, case_mix: float, model: str = "RF") -> str:
    "`plan --detect POINTS`: the cohort size at which `model`'s primary check detects that female skew (measured curve)."
    d = detectable_size(points / 100, model, case_mix, "argmax")
    head = f"{model} emulator, female skew (the primary check), case mix {case_mix:g}: "
    body = (f"an MDE of {points:g} points at about {d['n']:,.0f} records ({d['why']}; measured MDE: "
            f"{', '.join(f'{n:,} records: {100 * m:.1f} points' for n, m in d['measured'])})" if d["n"] is not None
            else f"no answer: {d['why']}")
    return (head + body + "\n(emulator points; the nurses' effect the audit can see is larger by 1 / attenuation: "
            "benchmarks/results/calibration_scale.json. FT: GPU only, not on the curve.)")


def register(sub) -> None:
    "Add the `metrics`, `swap-text`, `plan` and `compare` subcommands to the `triage-cf` parser's subparsers."
    m = sub.add_parser("metrics", help="bias metrics with bootstrap CIs from your own pairs CSV")
    m.add_argument("--pairs", required=True, help="CSV with pair_id, orig_sex (F|M), pred_orig, pred_cf, condition [, true_level, model]")
    m.add_argument("--out", required=True, help="output folder (metrics.csv, and per-level tables when true_level is given)")
    m.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples of pairs (default 1000)")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--ci", choices=["percentile", "bca"], default="percentile", help="bootstrap CI method")
    m.add_argument("--kappa-w", type=float, nargs=3, metavar=("KAPPA", "LOW", "HIGH"), default=None,
                   help="the model's quadratic weighted kappa on its test records and its CI: adds the fitness verdict")
    m.add_argument("--baseline-kappa", type=float, default=None,
                   help="kappa_w of the best non-LLM baseline on the same test records (with --kappa-w)")
    m.add_argument("--kappa-floor", type=float, default=0.20,
                   help="the CI's lower end must exceed this (default 0.20: above slight agreement; the level prior's kappa_w is 0)")
    m.add_argument("--baseline-margin", type=float, default=0.10,
                   help="'clearly worse' than the baseline: the CI's upper end more than this below it (default 0.10)")
    m.add_argument("--null", action="append", metavar="FILE", default=None,
                   help="a null emulator's predictions of the same pairs (same columns; repeatable; a null_id column "
                        "holds several): adds null_test.csv, the permutation test and its finding flag, and null_emulators.csv")
    m.add_argument("--alpha", type=float, default=0.05, help="level of the permutation test (default 0.05)")
    m.set_defaults(func=_cmd_metrics)
    w = sub.add_parser("swap-text", help="rewrite a note for the other sex with the counterfactual function g")
    w.add_argument("text", nargs="*", help="the text to rewrite (or use --file)")
    w.add_argument("--lang", required=True, choices=["en", "fr"])
    w.add_argument("--to", required=True, choices=["female", "male"])
    w.add_argument("--method", default="rules", choices=["rules", "llm"], help="rules (default) or the few-shot LLM")
    w.add_argument("--model", default=None, help="llm: smollm2 (default), a local model folder, or the server's model name")
    w.add_argument("--backend", default="local", choices=["local", "hf", "vllm", "openai"],
                   help="llm: the LLM layer's backend (default local; hf is its old name)")
    w.add_argument("--base-url", default=None, help="llm, backend openai: the server, e.g. http://localhost:8000/v1")
    w.add_argument("--cache", default=None, help="llm: answer cache, a DuckDB file (default <$TRIAGE_CF_CACHE>/llm_answers.duckdb)")
    w.add_argument("--n-shots", type=int, default=None, help="llm: exemplars in the prompt (default all 10; the paper's 5.3 used 7)")
    w.add_argument("--batch-size", type=int, default=4, help="llm: records per model batch (default 4)")
    w.add_argument("--file", default=None, help="a TSV whose --column is rewritten (adds swap_status, swap_reason)")
    w.add_argument("--column", default="text", help="the TSV column to rewrite (default: text)")
    w.add_argument("--out", default=None, help="output TSV (default: standard output)")
    w.set_defaults(func=_cmd_swap_text)
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
    p.add_argument("--detect", type=float, default=None, metavar="POINTS",
                   help="also say which cohort size detects a female skew of POINTS (e.g. 2.1) at 80%% power, from the "
                        "measured calibration curve (RF emulator)")
    p.add_argument("--case-mix", type=float, default=1.0, help="with --detect: the case mix by sex of the curve (0, 1, 2)")
    p.add_argument("--detect-model", choices=["RF", "MLP"], default="RF",
                   help="with --detect: the emulator whose measured curve answers (the FT emulator is GPU-only, not on it)")
    p.set_defaults(func=_cmd_plan)
    c = sub.add_parser("compare", help="finished runs side by side: Table 3, the audit's test and fitness across runs")
    c.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders (runs/<dataset>/<profile>), at least 2")
    c.add_argument("--out", required=True, help="output folder (comparison.csv, comparison.md, comparison.png)")
    c.set_defaults(func=_cmd_compare)
