"""The LLM layer against real servers: `transformers serve` (a real OpenAI-compatible server, started here on localhost)
for the generation path, and the suite's one fake server (tests/fake_openai.py) for what `transformers serve` cannot
do (log-probabilities, injected failures, hangs)."""
import asyncio
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from triage_cf.llm import (AnswerCache, LLMCapabilityError, LocalClient, make_client, render_chat, tiny_causal_lm,
                           tiny_tokenizer)

sys.path.insert(0, str(Path(__file__).parent))
from fake_openai import FakeOpenAI, free_port, level_logprobs, stop_process  # noqa: E402

CONVS = [[{"role": "system", "content": "You triage emergency patients."},
          {"role": "user", "content": f"A {40 + i} year old with chest pain. Level?"}] for i in range(4)]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-model")
    tok = tiny_tokenizer(["A 45 year old with chest pain. Level 1 2 3 4 5. You triage emergency patients."] * 40,
                         vocab_size=320)
    lm = tiny_causal_lm("llama", tok, seed=3)
    # as a chat model's generation config does: generation ends at the end-of-turn token too (server and local alike)
    lm.generation_config.eos_token_id = [tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")]
    lm.save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def served(tiny_folder, tmp_path_factory):
    "A real `transformers serve` process on localhost serving the tiny model folder (CPU, offline)."
    exe = Path(sys.executable).with_name("transformers")
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with open(log, "w") as fh:
        proc = subprocess.Popen([str(exe), "serve", str(tiny_folder), "--port", str(port), "--device", "cpu",
                                 "--dtype", "float32"], stdout=fh, stderr=subprocess.STDOUT, env=env,
                                cwd=tmp_path_factory.mktemp("serve-cwd"))
    url = f"http://127.0.0.1:{port}"
    try:
        t0 = time.time()
        while True:
            try:
                urllib.request.urlopen(url + "/v1/models", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.time() - t0 > 180:
                    raise RuntimeError(f"transformers serve did not start:\n{log.read_text()[-3000:]}")
                time.sleep(1)
        yield url + "/v1", str(tiny_folder)
    finally:
        stop_process(proc)


def test_real_server_generate_equals_local_greedy(served):
    url, model = served
    remote = make_client("openai", model=model, base_url=url, concurrency=4)
    local = make_client("local", model=model, load_dtype="float32")
    got = remote.generate(CONVS, max_tokens=8)
    want = local.generate(CONVS, max_tokens=8)
    assert [g.error for g in got] == [None] * len(CONVS)
    assert [g.text for g in got] == [w.text for w in want]
    assert all(g.output_tokens == 8 or g.finish_reason == "stop" for g in got)
    assert got[0].reasoning_tokens is None           # not reported: None, never 0
    assert remote.stats["calls"] == len(CONVS) and remote.stats["failed"] == 0


def test_real_server_without_logprobs_says_so(served):
    url, model = served
    remote = make_client("openai", model=model, base_url=url)
    with pytest.raises(LLMCapabilityError, match=r"127\.0\.0\.1.*no log-probabilities"):
        remote.generate(CONVS[:1], max_tokens=2, top_logprobs=5)
    with pytest.raises(LLMCapabilityError, match="score_continuations"):
        remote.score_continuations(CONVS[:1], '{"level": ', ["1", "2", "3"])


def test_fake_server_logprob_paths():
    with FakeOpenAI() as srv:
        c = make_client("openai", model="fake-model", base_url=srv.url, levels=[1, 2, 3, 4, 5], top_logprobs=5)
        g = c.generate(CONVS, max_tokens=16, top_logprobs=5)
        want = level_logprobs(CONVS[0][-1]["content"])
        best = max(want, key=want.get)
        assert g[0].text == '{"level": %s}' % best
        digit = [t for t in g[0].logprobs if t.token in want][0]
        assert digit.top == pytest.approx(want)
        assert c.fingerprint["served_model"] == "fake-model" and c.fingerprint["system_fingerprint"] == "fp_fake"
        s = c.score_continuations(CONVS, '{"level": ', ["1", "2", "3", "4", "5"])
        assert np.allclose(s[1].logprobs, list(level_logprobs(CONVS[1][-1]["content"]).values()))
        assert not s[1].censored.any()
        short = make_client("openai", model="fake-model", base_url=srv.url, top_logprobs=2)
        s2 = short.score_continuations(CONVS[:1], '{"level": ', ["1", "2", "3", "4", "5"])[0]
        assert s2.censored.sum() == 3                 # three levels outside the top 2: upper bounds, flagged
        assert (s2.logprobs[s2.censored] == s2.logprobs[~s2.censored].min()).all()
        p = c.label_probs(["prompt a", "prompt b", "prompt c"])
        assert p.shape == (3, 5) and np.allclose(p.sum(1), 1)
        assert np.allclose(np.log(p[0]), list(level_logprobs("prompt a").values()), atol=1e-5)


def test_fake_server_scores_from_prompt_logprobs():
    "vLLM's prompt_logprobs: every candidate scored exactly (never censored), one request per candidate; cached like the rest."
    with FakeOpenAI() as srv:
        c = make_client("openai", model="fake-model", base_url=srv.url, top_logprobs=2, score_method="prompt_logprobs")
        s = c.score_continuations(CONVS, '{"level": ', ["1", "2", "3", "4", "5"])
        for conv, x in zip(CONVS, s):
            assert np.allclose(x.logprobs, list(level_logprobs(conv[-1]["content"]).values())) and not x.censored.any()
        assert c.stats["calls"] == len(CONVS)            # counted per conversation, sent as 5 requests each
        assert c.score_continuations(CONVS, '{"level": ', ["1", "2", "3", "4", "5"])[0].cached is False   # no cache given
    with pytest.raises(ValueError, match="score_method"):
        make_client("openai", model="m", base_url="http://127.0.0.1:1/v1", score_method="echo")


def test_fake_server_without_logprobs_is_a_clear_error():
    with FakeOpenAI(logprobs=False) as srv:
        c = make_client("openai", model="m", base_url=srv.url, levels=[1, 2, 3])
        with pytest.raises(LLMCapabilityError, match=srv.url.replace(".", r"\.")):
            c.score_continuations(CONVS[:1], "", ["1", "2"])
        with pytest.raises(LLMCapabilityError):
            c.label_probs(["x"])
        assert c.generate(CONVS[:1], max_tokens=4)[0].logprobs is None    # not asked: no error


def test_retries_lose_and_duplicate_nothing():
    with FakeOpenAI(fail_share=0.3) as srv:
        c = make_client("openai", model="m", base_url=srv.url, concurrency=8, backoff=0.01)
        convs = [[{"role": "user", "content": f"case {i}"}] for i in range(60)]
        g = c.generate(convs, max_tokens=8)
        assert srv.injected > 5
        assert [x.error for x in g] == [None] * 60
        assert c.stats["retried"] == srv.injected
        assert sorted(srv.answered.values()) == [1] * 60        # every request answered exactly once


def test_timeouts_are_counted_outcomes():
    with FakeOpenAI(hang_if=lambda b: "case 2" in str(b.get("messages")), hang_s=3) as srv:
        c = make_client("openai", model="m", base_url=srv.url, timeout=0.5, max_retries=1, backoff=0.01)
        g = c.generate([[{"role": "user", "content": f"case {i}"}] for i in range(4)], max_tokens=4)
        assert [x.error for x in g] == [None, None, "timeout", None]
        assert c.stats["failed"] == 1 and c.stats["retried"] == 1


def test_cache_makes_no_repeated_call_and_keeps_no_key(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret-123")
    db = tmp_path / "answers.duckdb"
    with FakeOpenAI(hang_if=lambda b: "case 1" in str(b.get("messages")), hang_s=2) as srv:
        c = make_client("openai", model="m", base_url=srv.url, cache=db, timeout=0.5, max_retries=0)
        convs = [[{"role": "user", "content": f"case {i}"}] for i in range(3)]
        first = c.generate(convs, max_tokens=4)
        assert [x.error for x in first] == [None, "timeout", None]
        sent = sum(srv.attempts.values())
        c.cache.close()
        srv.hang_if = None
        again = make_client("openai", model="m", base_url=srv.url, cache=db)
        second = again.generate(convs, max_tokens=4)
        assert sum(srv.attempts.values()) == sent + 1            # only the failed request is sent again
        assert [x.cached for x in second] == [True, False, True]
        assert [x.text for x in second][0] == first[0].text
        assert "sk-test-secret" not in str(again.fingerprint)
        again.cache.close()
    assert b"sk-test-secret" not in db.read_bytes()


def test_local_cache_and_inside_a_running_loop(tmp_path):
    tok = tiny_tokenizer(["chest pain level 1 2 3"] * 20, vocab_size=280)
    lm = tiny_causal_lm("llama", tok)
    c = LocalClient(lm, tok, cache=tmp_path / "a.duckdb")
    a = c.generate(CONVS[:2], max_tokens=4)
    b = c.generate(CONVS[:2], max_tokens=4)
    assert [x.cached for x in b] == [True, True] and [x.text for x in a] == [x.text for x in b]
    s = c.score_continuations(CONVS[:2], "", ["1", "2"])
    assert c.score_continuations(CONVS[:2], "", ["1", "2"])[0].cached
    assert np.allclose(s[0].logprobs, c.score_continuations(CONVS[:2], "", ["1", "2"])[0].logprobs)
    with FakeOpenAI() as srv:      # a notebook runs code inside an event loop: the client must still work
        async def inside():
            return make_client("openai", model="m", base_url=srv.url).generate(CONVS[:2], max_tokens=4)
        assert [x.error for x in asyncio.run(inside())] == [None, None]


def test_render_chat_without_system_role():
    from triage_cf.llm import NO_SYSTEM_TEMPLATE
    tok = tiny_tokenizer(["a b c"] * 5, vocab_size=270, chat_template=NO_SYSTEM_TEMPLATE)
    text = render_chat(tok, CONVS[0])
    assert "You triage emergency patients.\n\nA 40 year old" in text


def test_margin_probe_generation_path_against_the_real_server(served):
    "YentlGuard's probe through a real server: the answers are the local model's; without logprobs, named outcomes or a clear error."
    from triage_cf.margins.probe import ProbeSettings, measure
    url, model = served
    remote = make_client("openai", model=model, base_url=url)
    local = make_client("local", model=model, load_dtype="float32")
    scale = {"name": "ESI", "levels": [1, 2, 3, 4, 5]}
    prompts = [c[-1]["content"] for c in CONVS]
    gen_only = ProbeSettings(scale=scale, mode="topk", top_logprobs=0, max_tokens=8)
    got, _, _ = measure(remote, prompts, gen_only, '{"esi": ')
    want, _, _ = measure(local, prompts, gen_only, '{"esi": ')
    assert [r["text"] for r in got] == [r["text"] for r in want]
    assert {r["outcome"] for r in got} == {"no_logprobs"} and all(np.isnan(r["delta_m"]) for r in got)
    with pytest.raises(LLMCapabilityError, match="no log-probabilities"):
        measure(remote, prompts, ProbeSettings(scale=scale, mode="topk", top_logprobs=20, max_tokens=8), '{"esi": ')
    with pytest.raises(LLMCapabilityError, match="score_continuations"):
        measure(remote, prompts, ProbeSettings(scale=scale, mode="score", max_tokens=8), '{"esi": ')
