"""The FT emulator's scores behind an OpenAI-compatible server, in the chain: `ft_backend: openai` makes 05_emulator
score the test records and 08_predict score the counterfactual pairs through the LLM layer's client, as on a GPU node
that serves the merged emulator with `vllm serve`. The server is the suite's one fake (tests/fake_openai.py): no real
local server returns the log-probabilities the label distribution needs (`transformers serve` ignores them). Every
pair prediction must be the server's distribution for exactly the prompt the local path would have sent."""
from __future__ import annotations

import json

import numpy as np
import pytest

from triage_cf.chain import StageFailed, reproduce
from triage_cf.core import VIEWS, read_parquet
from triage_cf.data import load_manifest
from triage_cf.audit.emulator import render_prompts
from triage_cf.audit.predict import pair_records

from fake_openai import FakeOpenAI, level_logprobs

STAGES = ["01_data", "02_cohort", "03_split", "05_emulator", "07_counterfactuals", "08_predict"]


def test_pairs_scored_on_a_server(tmp_path):
    from transformers import AutoTokenizer
    run = tmp_path / "run"
    with FakeOpenAI(model=str(run / "data" / "models" / "ft_merged")) as srv:   # vllm serve names a model by its folder
        res = reproduce("synth-en", "smoke", out=run, quiet=True, stages=STAGES,
                        overrides={"ft_backend": "openai", "ft_base_url": srv.url, "null_control": False,
                                   "ft_max_pairs": 12})
        assert [r.status for r in res] == ["ran"] * len(STAGES)
        requests = sum(srv.answered.values())
    manifest = load_manifest("synth-en")
    lang, text_fields = manifest["language"], list(manifest["text_fields"])
    pairs = read_parquet(run / "data" / "pairs.parquet")
    ft_pairs = pairs[pairs["ft_subsample"]]
    assert len(ft_pairs) == 12
    ft = read_parquet(run / "data" / "predictions" / "FT.parquet")
    assert len(ft) == 12 * len(VIEWS) * 2 and not (run / "data" / "predictions" / "FT_null.parquet").exists()
    meta = json.loads((run / "data" / "models" / "ft" / "emulator.json").read_text())
    levels = meta["levels"]
    tok = AutoTokenizer.from_pretrained(run / "data" / "models" / "ft" / "tokenizer", local_files_only=True)
    x, xc = pair_records(ft_pairs, text_fields)
    for side, recs in (("orig", x), ("cf", xc)):
        for view in VIEWS:
            prompts = render_prompts(recs, tok, levels, lang, view, text_fields=text_fields)
            want = np.exp(np.array([[level_logprobs(p)[str(l)] for l in levels] for p in prompts]))
            want /= want.sum(1, keepdims=True)
            got = ft[(ft["side"] == side) & (ft["view"] == view)].set_index("pair_id").loc[recs["pair_id"]]
            np.testing.assert_allclose(got[[f"p_{l}" for l in levels]].to_numpy(), want, atol=1e-6)
    assert requests > 0   # batched: several prompts per request (the probabilities above are the server's, not a local model's)
    out = (run / "notebooks" / "08_predict.ipynb").read_text()
    assert "views x 2 sides) on openai" in out


def test_the_emulator_server_is_checked_before_scoring(tmp_path):
    """With `ft_backend: openai` on a fresh run folder, 05_emulator trains, exports `ft_merged` and stops, with the command
    that serves it, when no server answers or the server serves another model; once the export is served under its name,
    the rerun scores the test records without training again."""
    run = tmp_path / "run"
    merged = run / "data" / "models" / "ft_merged"
    stages, base = STAGES[:4], {"ft_backend": "openai", "null_control": False}
    with pytest.raises(StageFailed, match="no server answers") as down:
        reproduce("synth-en", "smoke", out=run, quiet=True, stages=stages,
                  overrides={**base, "ft_base_url": "http://127.0.0.1:9/v1"})   # port 9: nothing listens
    assert f"vllm serve {merged}" in str(down.value)
    assert (merged / "emulator.json").is_file() and list(merged.glob("*.safetensors"))
    work = run / "data" / "models" / "ft_work"
    trained = {p: p.stat().st_mtime_ns for p in work.rglob("*") if p.is_file()}
    assert any(p.name == "trainable.safetensors" for p in trained)
    with FakeOpenAI(model="the-base-model") as srv:
        with pytest.raises(StageFailed, match="serves \\['the-base-model'\\], not"):
            reproduce("synth-en", "smoke", out=run, quiet=True, stages=stages, overrides={**base, "ft_base_url": srv.url})
    with FakeOpenAI(model=str(merged)) as srv:
        res = reproduce("synth-en", "smoke", out=run, quiet=True, stages=stages, overrides={**base, "ft_base_url": srv.url})
        assert res[-1].status == "ran" and sum(srv.answered.values()) > 0
    assert {p: p.stat().st_mtime_ns for p in trained} == trained   # the fine-tune was not redone
    assert len(read_parquet(run / "data" / "predictions" / "test_FT.parquet")) > 0
