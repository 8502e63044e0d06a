"""Benchmark: the rewriting function g (triage_cf.rewrite) on 10,000 notes per language, the rules and, beside them,
the spaCy analyser (issue 26). Writes benchmarks/results/rewrite.json.

    .venv/bin/python benchmarks/rewrite_bench.py [--n 10000] [--repeats 3] [--source auto|synth|pool]
        [--batch-sizes 64,256,1000] [--analyser-repeats 1]

Targets: rule-based g handles 10,000 notes in < 10 s on the 2-core machine ("fast enough to be invisible"); g on
the analyser 10,000 notes within 60 s, parsed in batches (`nlp.pipe`) with the components g does not read excluded
or disabled (`rewrite.ANALYSER_EXCLUDE`, `ANALYSER_DISABLE`). The analyser is timed as the pair stage calls it,
`counterfactual_texts` (sex-specific check, g, validation), at each batch size, with the rules through the same
call beside it (`analyser="none"`), and the pipeline's load time apart. The rules now add whole-word Appendix A matching, the his/her role from the following tokens and French
agreement across a verb or at a distance, which the pool below also exercises.
Notes come from the synthetic generator (triage_cf.synth.generate_raw, free-text fields) when it is importable
(`--source auto|synth`), otherwise from a fixed pool of triage-note sentences below (`--source pool`), drawn with a
fixed seed into notes of 3-7 sentences. The timed call is `g` itself (sex-specific check + rules); validation is
timed separately. The machine may be shared: the load average is recorded before and after, and the CPU time of g
beside its wall time (on a loaded machine the wall time overstates what g costs).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from triage_cf.core import write_json
from triage_cf.rewrite import SexSpecificContent, counterfactual_texts, g, load_analyser, rewriter_name, validate_rewrite

POOL = {
    "en": ["{a} yo {s} presents with chest pain x2 days.", "{P} states {p} pain is 7/10, worse with exertion.",
           "{P} denies SOB, no fever, no N/V.", "{Ps} husband found {o} on the floor at {p} home.",
           "EMS gave {o} aspirin 324 mg and NTG x1.", "Hx of HTN, DM2 on metformin 500mg BID, hernia repair 2015.",
           "{P} lives alone, {p} daughter is at bedside.", "Temp 101F at home, took tylenol.",
           "{T} is a pleasant {n} who fell while walking {p} dog.", "{P} reports {p} wife noticed confusion.",
           "Sees a therapist for anxiety; history of depression.", "{P} hit {r} with a hammer, lac to L thumb.",
           "Per daughter {p} baseline is A&Ox3.", "No LOC, no head strike, {p} BP 150/90, HR 88.",
           "{P} landed on {p} back; {p} last dose was at 8 am.", "Works at a computer, outer ear pain."],
    "fr": ["{Pt} de {a} ans, {k} pour HTA.", "{I} est {m} par les pompiers.", "{I} vit {sl}, {v}, {ax}.",
           "Sa fille l'a {rt} au sol ce matin.", "Douleur thoracique depuis 2 jours, non irradiante, EVA 6/10.",
           "{I} présente une dyspnée d'effort, pas de fièvre.", "Antécédents : diabète, HTA connue, tabagique.",
           "{I} est {f}, allergique à la pénicilline.", "Son voisin est inquiet, il appelle le SAMU.",
           "Il y a une plaie du scalp de 3 cm.", "{I} rentre chez {lui}.", "Traitement : metformine 1000 mg x2/j.",
           "{Det} {Pt} est {k} du service.", "{I} se sent {sl} et {ag}.", "{I} a été {vu} par le médecin.",
           "Hier, {rt} au sol par son voisin, {det} {Pt} est {dh}.", "A voulu chuter, invagination éliminée."],
}
FORMS = {
    ("en", "M"): dict(s="M", P="He", p="his", o="him", r="himself", Ps="His", T="Mr. Smith", n="gentleman"),
    ("en", "F"): dict(s="F", P="She", p="her", o="her", r="herself", Ps="Her", T="Ms. Smith", n="lady"),
    ("fr", "M"): dict(Pt="patient", k="connu", I="Il", m="amené", sl="seul", v="veuf", ax="anxieux", rt="retrouvé",
                      f="fumeur", lui="lui", Det="Le", ag="angoissé", vu="vu", det="le", dh="déshydraté"),
    ("fr", "F"): dict(Pt="patiente", k="connue", I="Elle", m="amenée", sl="seule", v="veuve", ax="anxieuse",
                      rt="retrouvée", f="fumeuse", lui="elle", Det="La", ag="angoissée", vu="vue", det="la",
                      dh="déshydratée"),
}


def pool_notes(lang: str, n: int, seed: int) -> list[tuple[str, str]]:
    "n (note, sex) pairs built from the sentence pool."
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        sex = "F" if rng.random() < 0.5 else "M"
        k = int(rng.integers(3, 8))
        sents = [POOL[lang][j] for j in rng.choice(len(POOL[lang]), size=k, replace=False)]
        out.append((" ".join(s.format(a=int(rng.integers(18, 95)), **FORMS[(lang, sex)]) for s in sents), sex))
    return out


def synth_notes(lang: str, n: int, seed: int) -> list[tuple[str, str]] | None:
    "n (note, sex) pairs from the synthetic generator's free-text fields, or None when it is not available."
    try:
        from triage_cf.synth import generate_raw
    except ImportError:
        return None
    raw = generate_raw(lang, n_records=n, seed=seed)
    cols = ["chiefcomplaint", "triage_note"] if lang == "en" else ["histoire_maladie", "antecedents"]
    sexcol = "gender" if lang == "en" else "sexe"
    raw = raw[raw[sexcol].isin(["F", "M", "H"])]          # records without a recorded sex have no counterfactual
    notes = raw[[c for c in cols if c in raw.columns]].fillna("").astype(str).agg(" ".join, axis=1)
    sex = raw[sexcol].map({"F": "F", "M": "M", "H": "M"})
    return list(zip(notes.tolist(), sex.tolist()))


def run(notes, lang, repeats):
    targets = ["M" if s == "F" else "F" for _, s in notes]
    times, cpu, excluded = [], [], 0
    for _ in range(repeats):
        excluded = 0
        out = []
        t0, c0 = time.perf_counter(), time.process_time()
        for (text, _), tgt in zip(notes, targets):
            try:
                out.append(g(text, tgt, lang, analyser="none"))     # the rules, one note at a time
            except SexSpecificContent:
                out.append(None)
                excluded += 1
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    t0 = time.perf_counter()
    n_ok = sum(validate_rewrite(t, o, lang)[0] for (t, _), o in zip(notes, out) if o is not None)
    t_val = time.perf_counter() - t0
    n_changed = sum(o is not None and o != t for (t, _), o in zip(notes, out))
    return {"n_notes": len(notes), "mean_chars": float(np.mean([len(t) for t, _ in notes])),
            "g_seconds_median": statistics.median(times), "g_seconds_all": times,
            "g_cpu_seconds_median": statistics.median(cpu),          # CPU time: what the wall time is on an idle core
            "notes_per_second": len(notes) / statistics.median(times), "validate_seconds": t_val,
            "n_excluded_sex_specific": excluded, "n_changed": n_changed, "n_validated_ok": n_ok,
            "meets_target_10k_under_10s": statistics.median(times) * 10_000 / len(notes) < 10.0}


def run_analyser(notes, lang, batch_sizes, repeats):
    "The pair stage's call (`counterfactual_texts`) on the rules and on the analyser at each batch size: seconds, notes/s."
    texts, targets = [t for t, _ in notes], ["M" if s == "F" else "F" for _, s in notes]
    t0 = time.perf_counter()
    load_analyser.cache_clear()
    nlp = load_analyser(lang)
    load_s = time.perf_counter() - t0
    if nlp is None:
        return {"rewriter": rewriter_name(lang), "skipped": "no spaCy pipeline installed"}

    def timed(analyser, bs, n_process=1):
        wall, cpu = [], []
        for _ in range(repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            res = counterfactual_texts(texts, targets, lang, analyser, batch_size=bs, n_process=n_process)
            wall.append(time.perf_counter() - t0); cpu.append(time.process_time() - c0)
        st = {k: sum(r.status == k for r in res) for k in ("ok", "excluded", "rejected")}
        return res, {"seconds_median": statistics.median(wall), "seconds_all": wall, "cpu_seconds_median": statistics.median(cpu),
                     "notes_per_second": len(texts) / statistics.median(wall), **{f"n_{k}": v for k, v in st.items()}}

    rules_res, rules = timed("none", 256)
    by_bs = {}
    for bs in batch_sizes:
        res, by_bs[str(bs)] = timed("spacy", bs)
    best = min(by_bs, key=lambda b: by_bs[b]["seconds_median"])
    res2, two = timed("spacy", int(best), n_process=2)          # nlp.pipe over the 2 cores (CPU time: the parent's only)
    assert [r.text for r in res2] == [r.text for r in res], "n_process=2 rewrote differently"
    sec10k = by_bs[best]["seconds_median"] * 10_000 / len(texts)
    differ = sum(a.text != b.text for a, b in zip(rules_res, res))
    return {"rewriter": rewriter_name(lang), "components_run": nlp.pipe_names, "load_seconds": load_s,
            "rules_counterfactual_texts": rules, "analyser_by_batch_size": by_bs, "best_batch_size": int(best),
            "analyser_best_batch_2_processes": two,
            "analyser_seconds_per_10k": sec10k, "meets_target_10k_under_60s": sec10k < 60.0,
            "analyser_over_rules_time_ratio": by_bs[best]["seconds_median"] / rules["seconds_median"],
            "n_notes_rewritten_differently": differ}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--source", choices=["auto", "synth", "pool"], default="auto")
    ap.add_argument("--batch-sizes", default="64,256,1000")
    ap.add_argument("--analyser-repeats", type=int, default=1)
    args = ap.parse_args(argv)
    load0 = os.getloadavg()
    results = {}
    for lang in ("en", "fr"):
        notes, source = None, "pool"
        if args.source in ("auto", "synth"):
            notes, source = synth_notes(lang, args.n, args.seed), "synth"
            if notes is None and args.source == "synth":
                raise SystemExit("--source synth: triage_cf.synth is not importable")
        if notes is None:
            notes, source = pool_notes(lang, args.n, args.seed), "pool"
        results[lang] = {"source": source, **run(notes, lang, args.repeats)}
        results[lang]["analyser"] = a = run_analyser(notes, lang, [int(b) for b in args.batch_sizes.split(",")],
                                                     args.analyser_repeats)
        if "skipped" not in a:
            print(f"{lang}: {a['rewriter']}: best batch {a['best_batch_size']}: {a['analyser_seconds_per_10k']:.1f} s per 10,000 "
                  f"notes ({a['analyser_over_rules_time_ratio']:.1f}x the rules through the same call); "
                  f"{a['n_notes_rewritten_differently']} notes rewritten differently")
        r = results[lang]
        print(f"{lang}: {r['n_notes']} notes ({source}, {r['mean_chars']:.0f} chars) in {r['g_seconds_median']:.2f} s "
              f"({r['notes_per_second']:.0f}/s, {r['g_cpu_seconds_median']:.2f} s CPU); validation {r['validate_seconds']:.2f} s; "
              f"{r['n_excluded_sex_specific']} excluded, {r['n_validated_ok']} validated")
    out = {"benchmark": "rewrite: rule-based g and g on the spaCy analyser (issue 26)",
           "target": "rules: 10,000 notes < 10 s; analyser: 10,000 notes < 60 s on 2 cores", "results": results,
           "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                       "loadavg_before": load0, "loadavg_after": os.getloadavg(),
                       "note": "shared machine: other workers' jobs run beside it; CPU seconds are beside the wall seconds"}}
    path = Path(__file__).resolve().parent / "results" / "rewrite.json"
    write_json(path, out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
