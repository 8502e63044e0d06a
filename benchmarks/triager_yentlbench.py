"""The decision audit of YentlBench's 15 models (`triage_cf.margins.triager`) on their 60 published run files,
summarised for the chapter `nbs/2_margins/02_triager.ipynb`, which renders its ranking table from the JSON this script writes.

    .venv/bin/python benchmarks/triager_yentlbench.py                # $TRIAGE_CF_DATA/yentlbench-results/results
    .venv/bin/python benchmarks/triager_yentlbench.py --out /tmp/yb  # also every table and figure (as `triage-cf triager`)

Writes benchmarks/results/triager_yentlbench.json: the ranking by mean pairwise disagreement with 95% cluster-bootstrap
CIs and YentlBench's PSS with its own rank, the omnibus tests, each model's count of tests with q < 0.05, the answers by
parse status, the exclusions and the check of the vignettes against the chain's. Aggregates only: no note text.
"""
from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import pandas as pd

from triage_cf.core import repo_root, write_json, write_table
from triage_cf.margins.triager import audit_yentlbench, write_triager_outputs

RANK_COLUMNS = ["model", "rank", "n", *[f"{k}{s}" for k in ("mean_pairwise_disagreement", "female_male_differ",
                                                             "any_change_vs_reference", "pss_yb")
                                        for s in ("", "_ci_low", "_ci_high")], "rank_pss_yb"]
#: Where a published YentlBench number would be: the data folder holds the run files and the analysis code, whose
#: README describes the outputs (cross_model_attention_summary.csv, ...) but ships none of them and states no number.
PUBLISHED_CHECKED = ["README.md", "analysis-code/README.md", "analysis-code/ (no *.csv, *.txt or *.json result file)"]


def _records(df: pd.DataFrame, cols: list[str]) -> list[dict]:
    return [{k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()} for r in df[cols].to_dict("records")]


def summary(answers: pd.DataFrame, t: dict, folder: Path, n_boot: int, seed: int, wall_s: float) -> dict:
    "The JSON summary of one audit of YentlBench's runs."
    r = t["ranking"].copy()
    r["rank_pss_yb"] = r["pss_yb"].rank(method="min").astype(int)
    tests = t["tests"]
    sig = tests.assign(sig=tests["q_bh"] < 0.05).groupby("model").agg(n_tests=("test", "size"),
                                                                      n_q_below_005=("sig", "sum")).reset_index()
    ps = t["parse_status"]
    per_model = ps.drop(columns="variant").groupby("model").sum().reset_index()
    return {
        "what": "YentlBench's decision audit of the written ESI level, 15 frontier models x 4 variants x 70 vignettes",
        "folder": "/".join(folder.parts[-2:]), "n_files": int(answers["source"].nunique()),
        "n_models": int(answers["model"].nunique()),
        "n_answers": len(answers), "n_vignettes": int(answers["vignette_id"].nunique()), "n_boot": n_boot,
        "seed": seed, "composite": "mean_pairwise_disagreement (rank 1: the least sex-sensitive model)",
        "ranking": _records(r.sort_values("rank"), RANK_COLUMNS),
        "omnibus": _records(t["omnibus"], list(t["omnibus"].columns)),
        "tests_q_below_005": _records(sig, list(sig.columns)),
        "parse_status_per_model": _records(per_model, list(per_model.columns)),
        "n_not_ok_per_variant": {v: int((g["n_answers"] - g["n_ok"]).sum()) for v, g in ps.groupby("variant")},
        "exclusions": _records(t["exclusions"], list(t["exclusions"].columns)),
        "vignette_match": _records(t["vignette_match"], list(t["vignette_match"].columns))[0],
        "yentlbench_published": {"numbers": None, "checked": PUBLISHED_CHECKED,
                                 "remark": "no published number to put beside ours; their composite (PSS) is "
                                           "recomputed here from their definition (pss_yb, rank_pss_yb)"},
        "wall_s": round(wall_s, 1),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_average_at_end": os.getloadavg()},
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    data = Path(os.environ.get("TRIAGE_CF_DATA", repo_root().parent / "shared" / "data"))
    ap.add_argument("--yentlbench", default=str(data / "yentlbench-results" / "results"))
    ap.add_argument("--n-boot", dest="n_boot", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="also write every table and figure here (tables/, figures/, data/)")
    ap.add_argument("--json", default=str(repo_root() / "benchmarks" / "results" / "triager_yentlbench.json"))
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    answers, tables = audit_yentlbench(a.yentlbench, n_boot=a.n_boot, seed=a.seed)
    wall = time.perf_counter() - t0
    if a.out:
        write_table(answers, Path(a.out) / "data", "triager_answers")
        write_triager_outputs(tables, Path(a.out) / "tables", Path(a.out) / "figures", prefix="triager")
    out = summary(answers, tables, Path(a.yentlbench), a.n_boot, a.seed, wall)
    write_json(a.json, out)
    print(f"{a.json}: {out['n_models']} models, {out['n_answers']} answers, {wall:.1f} s")
    return out


if __name__ == "__main__":
    main()
