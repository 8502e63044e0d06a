"""Smoke-profile runs of the real chain (`triage-cf reproduce`) shared by tests/test_crash_resume.py and
tests/test_reproducible.py.

A smoke chain takes minutes, so each uninterrupted run is made once per pytest process and reused by both test files;
the runs start in the background (subprocesses) and are waited for only when a test needs their outputs, so that the
uninterrupted runs and the killed-and-resumed run share the machine's cores instead of running one after the other.
"""
from __future__ import annotations

import atexit
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from triage_cf.core import sha256_file

REPO = Path(__file__).resolve().parents[1]
DATASET, PROFILE = "synth-en", "smoke"
#: seconds one smoke chain may take (a loaded 2-core CI machine; ~2-4 min idle)
CHAIN_TIMEOUT = 1800

_procs: dict[str, tuple[subprocess.Popen, Path]] = {}
_started: list[subprocess.Popen] = []
_root: list[Path] = []


def chain_command(out: Path) -> list[str]:
    "`triage-cf reproduce --dataset synth-en --profile smoke --out OUT` with this interpreter's environment."
    script = Path(sys.executable).with_name("triage-cf")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "triage_cf.cli"]
    return cmd + ["reproduce", "--dataset", DATASET, "--profile", PROFILE, "--out", str(out)]


def start_chain(out: Path, log: str) -> subprocess.Popen:
    """Start the chain into `out` in its own process group (stdout -> `out`/../<log>.out, stderr -> <log>.err).
    The synthetic dataset needs no data files; $TRIAGE_CF_DATA is passed on as set (CI: .ci/run)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    with open(out.parent / f"{log}.out", "w") as so, open(out.parent / f"{log}.err", "w") as se:
        p = subprocess.Popen(chain_command(out), stdout=so, stderr=se, env=env, cwd=REPO, start_new_session=True)
    p.log = out.parent / log  # type: ignore[attr-defined]
    _started.append(p)
    return p


def log_text(p: subprocess.Popen, stream: str = "out") -> str:
    return Path(f"{p.log}.{stream}").read_text(errors="replace")  # type: ignore[attr-defined]


def log_tail(p: subprocess.Popen, n: int = 4000) -> str:
    err = re.sub(r"[^\n]*\r", "", log_text(p, "err"))  # progress bars
    return f"--- stdout\n{log_text(p, 'out')[-n:]}\n--- stderr\n{err[-n:]}"


def stage_statuses(stdout: str) -> dict[str, str]:
    "stage -> ran | skipped | FAILED | BLOCKED, from the chain's one line per stage."
    return dict(re.findall(r"^(\d\d\w*)\s+(ran|skipped|FAILED|BLOCKED)\b", stdout, flags=re.M))


def wait_chain(p: subprocess.Popen, timeout: float = CHAIN_TIMEOUT) -> subprocess.Popen:
    "Wait for a chain started by `start_chain` and assert it finished without error."
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(p)
        pytest.fail(f"the chain took more than {timeout} s\n{log_tail(p)}")
    assert p.returncode == 0, f"the chain failed (exit {p.returncode})\n{log_tail(p)}"
    return p


def kill_tree(p: subprocess.Popen) -> None:
    """SIGKILL the chain as a crash would: its process group and the group of every process it started.

    jupyter_client starts each notebook kernel in a new session (its own process group), so killing the chain's group
    alone would leave the kernel running for up to a second (until its parent poller notices) and writing artifacts:
    the kernel's group is killed first, then the chain's."""
    import psutil
    try:
        kids = psutil.Process(p.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        kids = []
    groups = []
    for k in kids:
        try:
            g = os.getpgid(k.pid)
        except ProcessLookupError:
            continue
        if g != p.pid and g not in groups:
            groups.append(g)
    for g in [*groups, p.pid]:
        try:
            os.killpg(g, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.wait(timeout=60)
    psutil.wait_procs(kids, timeout=30)
    assert not [k for k in kids if k.is_running() and k.status() != psutil.STATUS_ZOMBIE], "a process of the chain survived SIGKILL"


def kill_when(p: subprocess.Popen, ready, what: str, timeout: float = CHAIN_TIMEOUT):
    """Poll every 50 ms; once `ready()` returns something truthy, SIGKILL the chain (`kill_tree`) and return it.
    Fails when the chain ends first (it never reached the kill window) or after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        hit = ready()
        if hit:
            kill_tree(p)
            return hit
        if p.poll() is not None:
            pytest.fail(f"the chain ended (exit {p.returncode}) before {what}\n{log_tail(p)}")
        if time.monotonic() > deadline:
            kill_tree(p)
            pytest.fail(f"no {what} after {timeout} s\n{log_tail(p)}")
        time.sleep(0.05)


def _root_dir(tmp_path_factory) -> Path:
    if not _root:
        _root.append(tmp_path_factory.mktemp("smoke-runs"))
    return _root[0]


def start_uninterrupted(name: str, tmp_path_factory) -> None:
    "Start the uninterrupted run `name` in the background unless this pytest process already started it."
    if name not in _procs:
        out = _root_dir(tmp_path_factory) / name
        _procs[name] = (start_chain(out, name), out)


def uninterrupted(name: str, tmp_path_factory) -> Path:
    "The run folder of the uninterrupted run `name` (started if needed), once it has finished."
    start_uninterrupted(name, tmp_path_factory)
    p, out = _procs[name]
    wait_chain(p)
    return out


def session_runs_module(request, module: str) -> bool:
    "True when the pytest session also runs tests of `module` (e.g. 'test_reproducible.py')."
    return any(Path(str(item.fspath)).name == module for item in request.session.items)


def artifact_digests(root: Path) -> dict[str, str]:
    """sha256 of every paper table (`tables/`) and every prediction file (`data/predictions/**.parquet`, durable chunks
    included), by path relative to the run folder."""
    root = Path(root)
    files = [p for p in (root / "tables").rglob("*") if p.is_file()]
    files += list((root / "data" / "predictions").rglob("*.parquet"))
    return {p.relative_to(root).as_posix(): sha256_file(p) for p in sorted(files) if not p.name.startswith(".")}


def assert_same_artifacts(a: Path, b: Path) -> dict[str, str]:
    "The tables and prediction files of run folders `a` and `b` are the same files, byte for byte."
    da, db = artifact_digests(a), artifact_digests(b)
    assert any(k.startswith("tables/") and k.endswith(".csv") for k in da), f"{a}: no tables"
    assert any(k.startswith("data/predictions/") for k in da), f"{a}: no prediction files"
    only_a, only_b = sorted(set(da) - set(db)), sorted(set(db) - set(da))
    differ = sorted(k for k in set(da) & set(db) if da[k] != db[k])
    assert not (only_a or only_b or differ), (f"run folders differ: only in {a.name}: {only_a}; only in {b.name}: {only_b}; "
                                              f"different bytes: {differ}")
    return da


@atexit.register
def _stop_leftovers() -> None:  # a failing test must not leave chains running
    for p in _started:
        if p.poll() is None:
            try:
                kill_tree(p)
            except Exception:
                pass
