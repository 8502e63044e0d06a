"""Benchmark of the LLM layer's OpenAI-compatible client (triage_cf.llm.OpenAIClient): throughput with bounded
concurrency against the sequential client, side by side on the same local server, and a fault run.

The server is the test suite's one fake OpenAI-compatible server (tests/fake_openai.py, a real HTTP server on
127.0.0.1, run in a process of its own as a real server would be) with a fixed latency per request, as a remote API or a busy vLLM deployment has. In the fault run it fails
the first attempt of 10% of the requests with 500 or 429; the client must retry them, and no request may be lost
(an error after the retries) or answered twice. Writes benchmarks/results/llm_client.json.

    .venv/bin/python benchmarks/llm_client.py [--n 200] [--latency 0.05] [--concurrency 16] [--fault-n 500]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from triage_cf.core import write_json  # noqa: E402
from triage_cf.llm import make_client  # noqa: E402


def convs(n: int, tag: str) -> list:
    return [[{"role": "system", "content": "You triage emergency patients."},
             {"role": "user", "content": f"{tag} vignette {i}: chest pain, HR 110. Level?"}] for i in range(n)]


@contextmanager
def server(latency: float, fail_share: float = 0.0):
    "tests/fake_openai.py in its own process; yields (base URL, stats())."
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fake_openai.py"), str(port), str(latency), str(fail_share)],
                            stdout=subprocess.PIPE, text=True)
    url = proc.stdout.readline().strip()
    stats = lambda: json.loads(urllib.request.urlopen(url + "/stats").read())
    try:
        yield url, stats
    finally:
        proc.terminate()
        proc.wait(10)


def timed(concurrency: int, n: int, latency: float, tag: str) -> dict:
    with server(latency) as (url, stats):
        c = make_client("openai", model="fake-model", base_url=url, concurrency=concurrency, progress=False)
        t0 = time.perf_counter()
        g = c.generate(convs(n, tag), max_tokens=8)
        wall = time.perf_counter() - t0
        return dict(concurrency=concurrency, requests=n, wall_s=round(wall, 3), requests_per_s=round(n / wall, 2),
                    errors=sum(x.error is not None for x in g), answered=stats()["answered"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--fault-n", type=int, default=500)
    ap.add_argument("--fail-share", type=float, default=0.10)
    a = ap.parse_args()
    load0 = os.getloadavg()
    seq = timed(1, a.n, a.latency, "seq")
    par = timed(a.concurrency, a.n, a.latency, "par")
    with server(a.latency, a.fail_share) as (url, stats):
        c = make_client("openai", model="fake-model", base_url=url, concurrency=a.concurrency, backoff=0.05,
                        progress=False)
        t0 = time.perf_counter()
        g = c.generate(convs(a.fault_n, "fault"), max_tokens=8)
        wall = time.perf_counter() - t0
        st = stats()
        fault = dict(requests=a.fault_n, fail_share=a.fail_share, concurrency=a.concurrency, wall_s=round(wall, 3),
                     sent=st["attempts"], injected_failures=st["injected"], answered=st["answered"],
                     retried=c.stats["retried"], lost=sum(x.error is not None for x in g), duplicated=st["duplicated"],
                     distinct_answered=st["distinct_answered"])
    ratio = round(seq["wall_s"] / par["wall_s"], 2)
    out = dict(task="LLM layer client: bounded concurrency vs sequential, and retries under injected 500/429",
               server=f"tests/fake_openai.py on 127.0.0.1, {a.latency * 1000:.0f} ms fixed latency per request",
               sequential=seq, concurrent=par, throughput_ratio=ratio, fault_run=fault,
               targets={"throughput_ratio_at_least": 10, "lost": 0, "duplicated": 0},
               met={"throughput_ratio": ratio >= 10, "lost": fault["lost"] == 0, "duplicated": fault["duplicated"] == 0},
               machine=dict(python=platform.python_version(), cpus=os.cpu_count(), load_before=[round(x, 2) for x in load0],
                            load_after=[round(x, 2) for x in os.getloadavg()]))
    write_json(ROOT / "benchmarks" / "results" / "llm_client.json", out)
    print(f"sequential {seq['wall_s']} s, concurrency {a.concurrency} {par['wall_s']} s: {ratio}x; fault run: sent "
          f"{fault['sent']}, answered {fault['answered']}, retried {fault['retried']}, lost {fault['lost']}, "
          f"duplicated {fault['duplicated']}")


if __name__ == "__main__":
    main()
