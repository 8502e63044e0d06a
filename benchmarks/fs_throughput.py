"""Benchmark: the FS baseline (RoBERTa trained from scratch, the counterfactual-triage paper, section 2.5) at the paper's size on this machine,
for the FLOP-based FS estimate of `triage-cf plan`. Writes benchmarks/results/fs_throughput.json.

    .venv/bin/python benchmarks/fs_throughput.py [--threads 2] [--steps 3] [--n-records 20000]

What it measures, with the package's own FS code (`triage_cf.audit.baselines`: tokenizer, config, MLM collator, classifier):
- FS text length: a synthetic cohort of each language (`--n-records` generated visits through stages 01_data to 03_split of the
  default profile) gives the training texts; the paper-size byte-level BPE tokenizer (52,000 vocabulary, min frequency
  2) is trained on them, and the mean tokens per FS text is divided by the FT prompt's measured mean (full view,
  `triage_cf.audit.plan.PROMPT_TOKENS`): the plan's FS tokens per record for that language.
- FLOP rates: with `FS_PAPER` sizes (12 layers, hidden 768) and the synth-en tokenizer, `--steps` timed steps (after
  one warm-up step) of MLM pre-training and of classifier fine-tuning on batches of 8 training texts of median
  length, and scoring in batches of 32; achieved FLOP/s = real tokens x `triage_cf.audit.plan.fs_flops_per_token` / seconds.
  fp32 on CPU (as `06_baselines` trains), CUDA when present.
The default-size FS of `make reproduce` is overhead-bound (the plan keeps its measured per-record time); these rates
are for sizes where compute dominates. Speed is measured here, never asserted in tests.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from triage_cf.audit.baselines import (_encode, _pad, fs_classifier_from_mlm, fs_config, fs_settings, record_texts,
                                 train_bpe_tokenizer)
from triage_cf.chain import reproduce
from triage_cf.core import RunPaths, read_parquet, write_json
from triage_cf.data import load_manifest
from triage_cf.audit.plan import PROMPT_TOKENS, fs_flops_per_token


def training_texts(dataset: str, n_records: int, out: Path) -> list[str]:
    "The training split's FS texts (full view) of a synthetic cohort of `n_records` generated visits."
    reproduce(dataset, "default", out=out, quiet=True, stages=["01_data", "02_cohort", "03_split"],
              overrides={"synth": {"n_records": n_records}})
    paths = RunPaths(out)
    cohort = read_parquet(paths.data / "cohort.parquet").set_index("record_id", drop=False)
    split = read_parquet(paths.data / "split.parquet")
    train = cohort.loc[sorted(split.loc[split["split"] == "train", "record_id"])]
    m = load_manifest(dataset)
    return record_texts(train, "full", m["language"], text_fields=list(m.get("text_fields", [])))


def _timed(step, n: int) -> list[float]:
    step()   # warm-up
    out = []
    for _ in range(n):
        t0 = time.perf_counter(); step(); out.append(time.perf_counter() - t0)
    return out


def rates(texts: list[str], tok, steps: int, dev: str) -> dict:
    "Achieved FLOP/s of MLM pre-training, classifier fine-tuning and scoring at FS_PAPER sizes (vocabulary of `tok`)."
    from transformers import DataCollatorForLanguageModeling, RobertaForMaskedLM
    s = fs_settings("paper")
    sv = {**s, "vocab_size": len(tok)}
    seqs, _ = _encode(tok, texts, s["max_length"])
    order = np.argsort([len(x) for x in seqs], kind="stable")
    mid = len(order) // 2
    batch8 = [seqs[i] for i in order[mid - 4: mid + 4]]
    batch32 = [[seqs[i] for i in order[mid - 32: mid]], [seqs[i] for i in order[mid: mid + 32]]]
    torch.manual_seed(0)
    mlm = RobertaForMaskedLM(fs_config(tok, s)).to(dev).train()
    coll = DataCollatorForLanguageModeling(tok, mlm=True, mlm_probability=s["mlm_probability"], seed=0)
    opt = torch.optim.AdamW(mlm.parameters(), lr=s["mlm_lr"])

    def mlm_step():
        b = {k: v.to(dev) for k, v in coll([{"input_ids": x} for x in batch8]).items()}
        mlm(**b).loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)

    clf = fs_classifier_from_mlm(mlm, [1, 2, 3, 4, 5]).train()
    opt2 = torch.optim.AdamW(clf.parameters(), lr=s["lr"])
    y = torch.tensor([i % 5 for i in range(len(batch8))], device=dev)

    def clf_step():
        clf(**_pad(batch8, tok.pad_token_id, dev), labels=y).loss.backward(); opt2.step(); opt2.zero_grad(set_to_none=True)

    def score():
        with torch.inference_mode():
            for b in batch32:
                clf(**_pad(b, tok.pad_token_id, dev)).logits.sum().item()

    clf.eval()
    t_score = _timed(score, steps)
    clf.train()
    t_mlm, t_clf = _timed(mlm_step, steps), _timed(clf_step, steps)
    n8, n32 = sum(map(len, batch8)), sum(len(x) for b in batch32 for x in b)
    seq8, seq32 = n8 / len(batch8), n32 / 64
    out = {}
    for kind, ts, n_tok, seq in (("mlm", t_mlm, n8, seq8), ("train", t_clf, n8, seq8), ("score", t_score, n32, seq32)):
        sec = statistics.median(ts)
        out[kind] = {"flops_per_s": n_tok * fs_flops_per_token(sv, seq, kind) / sec, "tokens_per_s": n_tok / sec,
                     "seconds": [round(t, 3) for t in ts], "tokens": n_tok, "mean_seq": round(seq, 1)}
    n_params = sum(p.numel() for p in clf.parameters())
    return {"settings": "FS_PAPER", "vocab_size": len(tok), "n_parameters": int(n_params), **out}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "fs_throughput.json"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--n-records", type=int, default=20000)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    s = fs_settings("paper")
    tokens, toks = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for ds, lang in (("synth-en", "en"), ("synth-fr", "fr")):
            texts = training_texts(ds, a.n_records, Path(tmp) / ds)
            tok = train_bpe_tokenizer(texts, s["vocab_size"], s["min_frequency"], s["max_length"])
            n = [len(x) for x in _encode(tok, texts, s["max_length"])[0]]
            prompt = PROMPT_TOKENS[ds]["full"][0]
            tokens[lang] = {"dataset": ds, "n_texts": len(texts), "vocab_size": len(tok), "mean_tokens": round(float(np.mean(n)), 1),
                            "max_tokens": int(max(n)), "ft_prompt_mean_tokens": prompt,
                            "fs_tokens_per_prompt_token": round(float(np.mean(n)) / prompt, 4)}
            toks[lang] = (texts, tok)
            print(f"{ds}: {len(texts)} texts, FS tokens {np.mean(n):.1f} mean (prompt {prompt}), vocab {len(tok)}", flush=True)
        texts, tok = toks["en"]
        r = rates(texts, tok, a.steps, dev)
    res = {"what": "FS (RoBERTa from scratch) at FS_PAPER sizes: text tokens per record and achieved FLOP/s",
           "device": dev, "threads": a.threads, "dtype": "float32", "text_tokens": tokens, "rates": r,
           "machine": {"cpu_count": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()],
                       "platform": platform.platform(), "torch": torch.__version__}}
    write_json(a.out, res)
    for k in ("mlm", "train", "score"):
        print(f"{k}: {r[k]['flops_per_s'] / 1e9:.1f} GFLOP/s ({r[k]['tokens_per_s']:.0f} tokens/s)")
    print(f"wrote {a.out}")
    return res


if __name__ == "__main__":
    main()
