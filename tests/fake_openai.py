"""The one fake OpenAI-compatible server of the test suite (and of benchmarks/llm_client.py).

A real HTTP server on 127.0.0.1 (standard library, a thread per request) for what no real local server can do here:
OpenAI-shaped log-probabilities (`transformers serve` ignores logprob requests), injected failures (500/429 on the first
attempt of a chosen share of requests), a fixed latency, and requests that hang past the client's timeout.

Answers are a deterministic function of the request: by default the model "answers" `{"level": L}` with L and the
level distribution derived from the sha256 of the last user message, and gives every token with its top alternatives.
A test can pass its own `responder(body) -> dict(text=..., tokens=[(token, logprob, {alt: logprob})], reasoning_tokens=None,
finish_reason="stop")`; reasoning tokens are hidden (not in `tokens`) and counted in `completion_tokens`, as OpenAI does.
"""
from __future__ import annotations

import hashlib
import json
import math
import socket
import subprocess
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LEVELS = ("1", "2", "3", "4", "5")


def free_port() -> int:
    "A free TCP port on 127.0.0.1 (for the real servers the tests start)."
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc, wait_s: float = 20) -> None:
    "Terminate a server process the tests started; kill it if it has not ended within `wait_s`."
    proc.terminate()
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()


def level_logprobs(text: str, levels=LEVELS) -> dict[str, float]:
    "A deterministic distribution over `levels` (log-probabilities) from the sha256 of `text`."
    h = hashlib.sha256(text.encode("utf-8")).digest()
    z = [h[i] / 32.0 for i in range(len(levels))]
    m = max(z)
    lse = m + math.log(sum(math.exp(v - m) for v in z))
    return {l: v - lse for l, v in zip(levels, z)}


def _last_user(body: dict) -> str:
    if "messages" in body:
        users = [m["content"] for m in body["messages"] if m["role"] == "user"]
        return users[-1] if users else ""
    return body.get("prompt", "") if isinstance(body.get("prompt"), str) else ""


def default_responder(body: dict) -> dict:
    "`{\"level\": L}`, L the most probable level of `level_logprobs(last user message)`; every token with alternatives."
    dist = level_logprobs(_last_user(body))
    best = max(dist, key=dist.get)
    if body.get("messages") and body["messages"][-1]["role"] == "assistant":   # continue_final_message: the level next
        return dict(text=best, tokens=[(best, dist[best], dist)])
    toks = [('{"', -0.01, {'{"': -0.01}), ("level", -0.02, {"level": -0.02}), ('":', -0.01, {'":': -0.01}),
            (" ", -0.03, {" ": -0.03}), (best, dist[best], dist), ("}", -0.01, {"}": -0.01})]
    return dict(text="".join(t for t, _, _ in toks), tokens=toks)


class FakeOpenAI:
    """Context manager: `with FakeOpenAI(...) as srv: srv.url` is the base URL (`http://127.0.0.1:PORT/v1`).

    `fail_share`: share of distinct requests whose first attempt fails (alternately 500 and 429, by hash); `latency`:
    seconds added to every answer; `hang_if(body)`: requests that sleep `hang_s` before answering; `logprobs=False`:
    a server that ignores logprob requests (answers without the field)."""

    def __init__(self, responder=default_responder, latency: float = 0.0, fail_share: float = 0.0, logprobs: bool = True,
                 hang_if=None, hang_s: float = 5.0, model: str = "fake-model", port: int = 0):
        self.responder, self.latency, self.fail_share, self.logprobs = responder, latency, fail_share, logprobs
        self.hang_if, self.hang_s, self.model, self.port = hang_if, hang_s, model, port
        self.lock = threading.Lock()
        self.attempts: Counter = Counter()   # request key -> attempts received
        self.answered: Counter = Counter()   # request key -> 200 answers sent
        self.injected = 0

    # -- bookkeeping -------------------------------------------------------------------------------------------------
    @staticmethod
    def key(body: dict) -> str:
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()

    def _should_fail(self, key: str, attempt: int) -> int | None:
        if attempt > 1 or self.fail_share <= 0:
            return None
        h = int(key[:8], 16)
        return (500 if h % 2 else 429) if (h % 10_000) < self.fail_share * 10_000 else None

    # -- answers ------------------------------------------------------------------------------------------------------
    def _tokens(self, tokens, k):
        out = []
        for tok, lp, top in tokens:
            alts = sorted(top.items(), key=lambda kv: -kv[1])[:k]
            out.append({"token": tok, "logprob": lp, "bytes": list(tok.encode()),
                        "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in alts]})
        return out

    def chat(self, body: dict) -> dict:
        ans = self.responder(body)
        n_prompt = sum(len(m["content"].split()) for m in body.get("messages", []))
        choice = {"index": 0, "message": {"role": "assistant", "content": ans["text"]},
                  "finish_reason": ans.get("finish_reason", "stop")}
        if self.logprobs and body.get("logprobs"):
            choice["logprobs"] = {"content": self._tokens(ans["tokens"], int(body.get("top_logprobs") or 0))}
        # as OpenAI reports it: completion_tokens counts the hidden reasoning tokens too
        n_out = len(ans["tokens"]) + (ans.get("reasoning_tokens") or 0)
        usage = {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}
        if ans.get("reasoning_tokens") is not None:
            usage["completion_tokens_details"] = {"reasoning_tokens": ans["reasoning_tokens"]}
        out = {"id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": self.model,
               "system_fingerprint": "fp_fake", "choices": [choice], "usage": usage}
        if body.get("prompt_logprobs") is not None:   # vLLM's extension: log p of the prompt's own tokens
            out["prompt_logprobs"] = self._prompt_logprobs(body)
        return out

    def _prompt_logprobs(self, body: dict) -> list:
        "vLLM-shaped prompt log-probabilities: the last assistant message's trailing level digit scored by `level_logprobs`."
        words = " ".join(m["content"] for m in body["messages"][:-1]).split()
        last = body["messages"][-1]["content"]
        head, digit = last[:-1], last[-1]
        lp = level_logprobs(_last_user(body)).get(digit, -9.0)
        entry = lambda i, tok, v: {str(i): {"logprob": v, "rank": 1, "decoded_token": tok}}
        return [None] + [entry(i, w, -0.1) for i, w in enumerate(words)] + [entry(9998, head, -0.05), entry(9999, digit, lp)]

    def completions(self, body: dict) -> dict:
        prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
        choices = []
        for i, p in enumerate(prompts):
            dist = level_logprobs(p)
            best = max(dist, key=dist.get)
            c = {"index": i, "text": best, "finish_reason": "length", "logprobs": None}
            if self.logprobs and body.get("logprobs"):
                k = int(body["logprobs"])
                top = dict(sorted(dist.items(), key=lambda kv: -kv[1])[:k])
                c["logprobs"] = {"tokens": [best], "token_logprobs": [dist[best]], "top_logprobs": [top], "text_offset": [0]}
            choices.append(c)
        return {"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": self.model, "choices": choices,
                "usage": {"prompt_tokens": sum(len(p.split()) for p in prompts), "completion_tokens": len(prompts),
                          "total_tokens": 0}}

    # -- server -------------------------------------------------------------------------------------------------------
    def __enter__(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):   # quiet
                pass

            def _send(self, code: int, payload: dict, headers=None):
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path.endswith("/stats"):   # counters, for a server run in its own process
                    with fake.lock:
                        return self._send(200, {"attempts": sum(fake.attempts.values()), "injected": fake.injected,
                                                "answered": sum(fake.answered.values()), "distinct_answered": len(fake.answered),
                                                "duplicated": sum(v - 1 for v in fake.answered.values() if v > 1)})
                self._send(200, {"object": "list", "data": [{"id": fake.model, "object": "model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                key = fake.key(body)
                with fake.lock:
                    fake.attempts[key] += 1
                    attempt = fake.attempts[key]
                if fake.hang_if is not None and fake.hang_if(body):
                    time.sleep(fake.hang_s)
                if fake.latency:
                    time.sleep(fake.latency)
                code = fake._should_fail(key, attempt)
                if code is not None:
                    with fake.lock:
                        fake.injected += 1
                    return self._send(code, {"error": {"message": "injected failure", "type": "server_error"}},
                                      {"retry-after": "0"} if code == 429 else None)
                try:
                    payload = fake.completions(body) if self.path.endswith("/completions") and "chat" not in self.path \
                        else fake.chat(body)
                except Exception as e:   # a responder bug shows up in the test, not as a hang
                    return self._send(400, {"error": {"message": f"fake server: {e}"}})
                with fake.lock:
                    fake.answered[key] += 1
                self._send(200, payload)

        class Server(ThreadingHTTPServer):
            request_queue_size = 128   # many clients at once: none refused at the socket

        self.server = Server(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


if __name__ == "__main__":   # a server in its own process (benchmarks): python tests/fake_openai.py PORT LATENCY FAIL_SHARE
    import sys
    with FakeOpenAI(latency=float(sys.argv[2]), fail_share=float(sys.argv[3]), port=int(sys.argv[1])) as srv:
        print(srv.url, flush=True)
        threading.Event().wait()
