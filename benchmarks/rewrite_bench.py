"""Benchmark: the rule-based rewriting function g (triage_cf.rewrite) on 10,000 notes per language.
Writes benchmarks/results/rewrite.json.

    .venv/bin/python benchmarks/rewrite_bench.py [--n 10000] [--repeats 3] [--source auto|synth|pool]

Target: rule-based g handles 10,000 notes in < 10 s on the 2-core machine ("fast enough to
be invisible"); the rules now add whole-word Appendix A matching, the his/her role from the following tokens and French
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
from triage_cf.rewrite import SexSpecificContent, g, validate_rewrite

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
                out.append(g(text, tgt, lang))
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--source", choices=["auto", "synth", "pool"], default="auto")
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
        r = results[lang]
        print(f"{lang}: {r['n_notes']} notes ({source}, {r['mean_chars']:.0f} chars) in {r['g_seconds_median']:.2f} s "
              f"({r['notes_per_second']:.0f}/s, {r['g_cpu_seconds_median']:.2f} s CPU); validation {r['validate_seconds']:.2f} s; "
              f"{r['n_excluded_sex_specific']} excluded, {r['n_validated_ok']} validated")
    out = {"benchmark": "rewrite: rule-based g", "target": "10,000 notes < 10 s", "results": results,
           "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                       "loadavg_before": load0, "loadavg_after": os.getloadavg()}}
    path = Path(__file__).resolve().parent / "results" / "rewrite.json"
    write_json(path, out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
