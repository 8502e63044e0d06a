"""Benchmark: the local backend's batched generation (LocalClient, `gen_batch_size` conversations per
`generate` call, shared prompt prefix) against one prompt at a time (`gen_batch_size=1`), same model, same prompts of
the transgender-bias tasks (word association and allocation), greedy decoding. Records the wall time of each, the
ratio, and whether every answer is identical. No answer cache is used (each path computes every answer).

    .venv/bin/python benchmarks/tbias_batching.py                       # SmolLM2-135M-Instruct, 32 prompts
    .venv/bin/python benchmarks/tbias_batching.py --model tiny-llama    # a tiny random Llama (seconds)

Writes benchmarks/results/tbias_batching.json. The machine may be shared: the load average is recorded before and after.
Speed is measured here, never asserted in tests.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import pandas as pd

from triage_cf.tbias.allocation import allocation_requests, make_pairs, make_patients
from triage_cf.tbias.words import association_requests, load_words, make_tb_client


def prompts(n: int) -> tuple[list, list]:
    "Half word-association prompts (EN/ES), half allocation prompts (EN/ES, selection), with their answer budgets."
    words = association_requests(load_words(), ["en", "es"], ["risk", "appearance", "veracity", "morality"], max(1, n // 16), 0)
    p = make_patients()
    alloc = allocation_requests(make_pairs(p).groupby("service").head(1), p, ["en", "es"], ["selection"])
    w, a = words.head(n // 2), alloc.head(n - n // 2)
    return list(w.messages) + list(a.messages), [96] * len(w) + [32] * len(a)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: fastest on the shared 2-core machine)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "tbias_batching.json"))
    args = ap.parse_args()
    import torch
    torch.set_num_threads(args.threads)
    convs, budgets = prompts(args.n)
    corpus = [m["content"] for c in convs for m in c]
    load0 = os.getloadavg()
    res = {}
    for name, bs in (("batched", args.batch), ("one_at_a_time", 1)):
        client = make_tb_client("local", args.model, corpus=corpus, seed=0, gen_batch_size=bs)
        client.generate(convs[:1], max_tokens=4)                       # load the model outside the timing
        t0 = time.perf_counter()
        gens = client.generate(convs, max_tokens=budgets, temperature=0.0)
        res[name] = {"wall_s": round(time.perf_counter() - t0, 2), "gen_batch_size": bs,
                     "output_tokens": int(sum(g.output_tokens or 0 for g in gens)), "texts": [g.text for g in gens]}
    same = [a == b for a, b in zip(res["batched"]["texts"], res["one_at_a_time"]["texts"])]
    out = {"model": args.model, "n_prompts": len(convs), "max_tokens": {"word_association": 96, "allocation": 32},
           "batched_wall_s": res["batched"]["wall_s"], "one_at_a_time_wall_s": res["one_at_a_time"]["wall_s"],
           "speedup": round(res["one_at_a_time"]["wall_s"] / res["batched"]["wall_s"], 2),
           "output_tokens": {k: v["output_tokens"] for k, v in res.items()},
           "identical_answers": int(sum(same)), "differing_answers": int(len(same) - sum(same)),
           "differing_examples": [{"i": i, "batched": res["batched"]["texts"][i][:200], "one_at_a_time": res["one_at_a_time"]["texts"][i][:200]}
                                  for i, s in enumerate(same) if not s][:3],
           "torch_threads": args.threads, "load_average_before": load0, "load_average_after": os.getloadavg(),
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform()}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in out.items() if k != "differing_examples"}, indent=2))


if __name__ == "__main__":
    main()
