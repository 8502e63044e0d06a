"""Benchmark: the few-shot LLM rewriting function g (triage_cf.audit.rewrite_llm, paper section 5.3 / Appendix B.2)
end to end with a real model on a handful of synthetic records per language. Writes benchmarks/results/rewrite_llm.json.

    nice -n 10 .venv/bin/python benchmarks/rewrite_llm.py [--n 8] [--model smollm2] [--backend local] [--batch-size 4]

Records come from the synthetic generator (triage_cf.synth.generate_raw, fixed seed): the first `--n` records per
language whose text fields hold no Appendix A term (those are excluded before any model call, so they say nothing
about the model). French records send their history of present illness and past medical history, English ones their
triage note. The generator also rendered every text for the other sex from the same template draw: that is the truth.

Reported (quality is measured, not asserted; a 135M model is expected to do badly):
  exact-match rate of the accepted rewrite against the generator's rendering (per record: every field equal; and per
  field), the statuses (ok / unparsed / rejected by validate_rewrite), the parse-failure and rejection reasons, the
  validation pass rate of the parsed answers, the rule-based g's exact match on the same records for comparison,
  seconds (model load, first run, second run) and the model calls of a second run over the same cache (must be 0).
The machine may be shared: the load average is recorded before and after.
"""
from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from collections import Counter
from pathlib import Path

from triage_cf.core import write_json
from triage_cf.rewrite import counterfactual_text, is_sex_specific
from triage_cf.audit.rewrite_llm import LLMRewriter, make_rewriter
from triage_cf.synth import generate_raw

FIELDS = {"fr": {"hpi": ("histoire_maladie", "histoire_maladie_autre_sexe"), "pmh": ("antecedents", "antecedents_autre_sexe")},
          "en": {"note": ("triage_note", "triage_note_other_sex")}}
SEX = {"fr": {"H": "M", "F": "F"}, "en": {"M": "M", "F": "F"}}
SEX_COL = {"fr": "sexe", "en": "gender"}


def sample(lang: str, n: int, seed: int) -> list[dict]:
    "The first n rewritable synthetic records of `lang`: {source_sex, fields, truth}."
    raw = generate_raw(lang, max(20 * n, 100), seed)
    out = []
    for r in raw.to_dict("records"):
        sex = SEX[lang].get(r[SEX_COL[lang]])
        fields = {f: (r[c] if isinstance(r[c], str) and r[c].strip() else None) for f, (c, _) in FIELDS[lang].items()}
        if sex is None or all(v is None for v in fields.values()):
            continue
        if any(v is not None and is_sex_specific(v, lang) for v in fields.values()):
            continue
        out.append({"source_sex": sex, "fields": fields,
                    "truth": {f: (r[t] if fields[f] is not None else None) for f, (_, t) in FIELDS[lang].items()}})
        if len(out) == n:
            break
    return out


def score(lang: str, recs: list[dict], results: list[dict]) -> dict:
    status = Counter()
    reasons = Counter()
    exact_records = 0
    field_exact = Counter()
    field_n = Counter()
    parsed_fields = valid_fields = 0
    for rec, res in zip(recs, results):
        st = [r.status for f, r in res.items() if rec["fields"][f] is not None]
        rstat = next((s for s in ("unparsed", "rejected", "excluded") if s in st), "ok")
        status[rstat] += 1
        for f, r in res.items():
            if rec["fields"][f] is None:
                continue
            field_n[f] += 1
            field_exact[f] += int(r.status == "ok" and r.text == rec["truth"][f])
            if r.status in ("ok", "rejected"):
                parsed_fields += 1
                valid_fields += int(r.status == "ok")
            if r.status != "ok":
                reasons[f"{r.status}: {r.reason.split(' at token')[0][:90]}"] += 1
        exact_records += int(all(r.status == "ok" and r.text == rec["truth"][f]
                                 for f, r in res.items() if rec["fields"][f] is not None))
    n = len(recs)
    return {
        "n_records": n,
        "exact_match_records": exact_records / n if n else None,
        "exact_match_by_field": {f: field_exact[f] / field_n[f] for f in field_n},
        "status_counts": dict(status),
        "parse_failures": status["unparsed"],
        "validation_pass_rate_of_parsed_fields": valid_fields / parsed_fields if parsed_fields else None,
        "n_parsed_fields": parsed_fields,
        "failure_reasons": dict(reasons.most_common()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=8, help="records per language")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--langs", default="fr,en")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--backend", default="local", choices=["local", "vllm", "openai"])
    ap.add_argument("--base-url", default=None)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--n-shots", type=int, default=None, help="exemplars per prompt (default: all 10)")
    ap.add_argument("--cache", default=None, help="answer cache, a DuckDB file (default: in a fresh temporary folder, so the first run computes)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "rewrite_llm.json"))
    args = ap.parse_args()

    load_before = os.getloadavg()
    tmp = None
    if args.cache is None:
        tmp = tempfile.TemporaryDirectory(prefix="rewrite_llm_cache_")
    cache = Path(args.cache) if args.cache else Path(tmp.name) / "answers.duckdb"
    results = {}
    samples = []
    for lang in args.langs.split(","):
        recs = sample(lang, args.n, args.seed)
        t0 = time.perf_counter()
        rw = make_rewriter(lang, model=args.model, backend=args.backend, base_url=args.base_url, cache=cache,
                           n_shots=args.n_shots, batch_size=args.batch_size)
        t_load = time.perf_counter() - t0
        targets = ["M" if r["source_sex"] == "F" else "F" for r in recs]
        t0 = time.perf_counter()
        first = rw.rewrite_records([r["fields"] for r in recs], targets)
        t_first = time.perf_counter() - t0
        calls_first = rw.client.stats["calls"]
        again = LLMRewriter(rw.client, lang, n_shots=args.n_shots, batch_size=args.batch_size)
        calls_before = rw.client.stats["calls"]
        t0 = time.perf_counter()
        second = again.rewrite_records([r["fields"] for r in recs], targets)
        t_second = time.perf_counter() - t0
        rules = [{f: counterfactual_text(v, t, lang) for f, v in r["fields"].items()} for r, t in zip(recs, targets)]
        res = score(lang, recs, first)
        res.update({
            "rules_g_on_same_records": {k: score(lang, recs, rules)[k] for k in ("exact_match_records", "status_counts")},
            "prompt_version": rw.prompt_version,
            "backend": rw.client.describe(),
            "seconds_model_load": round(t_load, 2),
            "seconds_first_run": round(t_first, 2),
            "seconds_per_record_first_run": round(t_first / max(1, calls_first), 2),
            "model_calls_first_run": calls_first,
            "seconds_second_run": round(t_second, 3),
            "model_calls_second_run": rw.client.stats["calls"] - calls_before,
            "second_run_identical": second == first,
            "cache_hits_second_run": again.stats["cache_hits"],
        })
        results[lang] = res
        for rec, t, r in zip(recs, targets, first):
            samples.append({"lang": lang, "target_sex": t, "input": rec["fields"], "truth": rec["truth"],
                            "llm": {f: {"status": x.status, "text": x.text, "reason": x.reason} for f, x in r.items()}})
        print(f"[{lang}] {res['n_records']} records: exact {res['exact_match_records']}, statuses {res['status_counts']}, "
              f"{t_first:.1f} s, second run {res['model_calls_second_run']} model calls", flush=True)
    write_json(args.out, {
        "benchmark": "rewrite: few-shot LLM g end to end",
        "model": args.model, "backend": args.backend, "n_per_language": args.n, "seed": args.seed,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "loadavg_before": list(load_before), "loadavg_after": list(os.getloadavg())},
        "results": results,
        "records": samples,
        "note": "quality is reported, not asserted; exact match = the accepted rewrite equals the generator's other-sex rendering",
    })
    print(f"wrote {args.out}")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
