"""Benchmark of the two ΔM sources of the token-margin probes (YentlGuard): teacher-forced scoring of every level after the
answer prefix (`client.score_continuations`, what the local and vLLM backends use) against generating the JSON answer
with `top_logprobs=20` and reading ΔM at its decision position (what an API model allows), on the same prompts with the
same model (default: the seed's 280 MIMIC-IV-ED Demo pass-1 prompts, the offline SmolLM2-135M-Instruct).

    .venv/bin/python benchmarks/margins_scoring.py              # 280 prompts
    .venv/bin/python benchmarks/margins_scoring.py --n 40       # reduced size (the JSON records n)

Reports the wall-time ratio (generation / scoring), how many answers have a decision position at all, and where both
exist the agreement of the two ΔM values (mean and max absolute difference, Pearson and Spearman correlations, share of
censored top-k values, agreement of the arg-max level). Writes benchmarks/results/margins_scoring.json. Speed is
measured here, never asserted in tests.
"""
from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from triage_cf.core import repo_root, write_json
from triage_cf.data import load_manifest, load_records
from triage_cf.llm import make_client
from triage_cf.margins.measures import answer_prefix, delta_m, load_design, load_templates, make_vignettes, select_vignettes
from triage_cf.margins.probe import ProbeSettings, read_topk


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="mimic-iv-ed-demo")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--n", type=int, default=None, help="first N prompts only (default: all)")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--top-logprobs", type=int, default=20)
    ap.add_argument("--out", default=str(repo_root() / "benchmarks" / "results" / "margins_scoring.json"))
    a = ap.parse_args(argv)
    m = load_manifest(a.dataset)
    records, _ = load_records(a.dataset)
    design, _ = load_design("auto", loader=m["loader"])
    kept, _, _ = select_vignettes(records, design, m["language"])
    tpl = load_templates(lang=m["language"])
    vig = make_vignettes(kept, m["triage_scale"], tpl)
    prompts = vig["prompt"].tolist()[: a.n] if a.n else vig["prompt"].tolist()
    st = ProbeSettings(m["triage_scale"], lang=m["language"], mode="topk", max_tokens=a.max_tokens, top_logprobs=a.top_logprobs)
    convs = [[{"role": "user", "content": p}] for p in prompts]
    client = make_client("local", model=a.model)
    client.score_continuations(convs[:2], prefix=answer_prefix(tpl, m["triage_scale"]["name"]), candidates=["1"])  # load the model
    t0 = time.perf_counter()
    conts = client.score_continuations(convs, prefix=answer_prefix(tpl, m["triage_scale"]["name"]),
                                       candidates=[str(l) for l in st.levels])
    t_score = time.perf_counter() - t0
    t0 = time.perf_counter()
    gens = client.generate(convs, max_tokens=a.max_tokens, temperature=0.0, top_logprobs=a.top_logprobs)
    t_gen = time.perf_counter() - t0
    rows = []
    for c, g in zip(conts, gens):
        dm_s, _ = delta_m(c.logprobs, c.censored)
        lp, cen, outcome = read_topk(g, st)
        dm_g, dm_g_cen = delta_m(lp, cen)
        rows.append(dict(dm_score=dm_s, dm_gen=dm_g, dm_gen_censored=dm_g_cen, outcome=outcome,
                         level_score=st.levels[int(np.argmax(c.logprobs))],
                         level_gen=st.levels[int(np.nanargmax(np.where(cen, -np.inf, lp)))] if not np.isnan(dm_g) else None))
    d = pd.DataFrame(rows)
    both = d[d["dm_gen"].notna()]
    exact = both[~both["dm_gen_censored"]]
    agree = {"n_both": len(both), "n_gen_censored": int(both["dm_gen_censored"].sum())}
    if len(exact) >= 2:
        diff = (exact["dm_gen"] - exact["dm_score"]).abs()
        agree.update(mean_abs_diff_nats=float(diff.mean()), max_abs_diff_nats=float(diff.max()),
                     pearson=float(stats.pearsonr(exact["dm_score"], exact["dm_gen"])[0]),
                     spearman=float(stats.spearmanr(exact["dm_score"], exact["dm_gen"])[0]),
                     argmax_agreement=float((exact["level_score"] == exact["level_gen"]).mean()))
    out = {
        "what": "ΔM: teacher-forced scoring vs generated JSON answer + top_logprobs (YentlGuard probes)",
        "dataset": a.dataset, "model": a.model, "fingerprint": client.fingerprint, "n_prompts": len(prompts),
        "max_tokens": a.max_tokens, "top_logprobs": a.top_logprobs,
        "wall_s": {"score_continuations": round(t_score, 2), "generate_top_logprobs": round(t_gen, 2)},
        "ratio_generate_over_score": round(t_gen / t_score, 2) if t_score > 0 else None,
        "generated_outcomes": d["outcome"].value_counts().to_dict(),
        "delta_m_score": {"mean": float(d["dm_score"].mean()), "median": float(d["dm_score"].median()),
                          "share_below_1_nat": float((d["dm_score"] < 1).mean())},
        "agreement": agree,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_average_at_end": os.getloadavg()},
        "note": ("a decision position exists only where the model wrote the JSON level key; where it did not, only the "
                 "teacher-forced path gives ΔM (the reason the local and vLLM backends use it)"),
    }
    write_json(a.out, out)
    print(f"{a.out}: score {t_score:.1f} s, generate {t_gen:.1f} s (x{out['ratio_generate_over_score']}), "
          f"outcomes {out['generated_outcomes']}, agreement {agree}")
    return out


if __name__ == "__main__":
    main()
