"""`triage-cf fetch` against a real local HTTP server (`python -m http.server` on 127.0.0.1) serving copies of the shared
open data under the public sources' URL paths: a good download is placed and verified, a corrupted one is refused and
fetched again once the server is fixed, a present file is not downloaded again, and credentialed or restricted datasets
are refused with guidance. Skips, saying why, where the shared files are absent."""
import gzip
import hashlib
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from triage_cf.cli import main
from triage_cf.core import data_root, manifest_dir, sha256_file
from triage_cf.data import file_checksum_status, load_manifest, load_records
from triage_cf.fetch import FETCH_BASE_URL_ENV, AccessNotOpen, download_plan, fetch_dataset

OPEN = ("mimic-iv-ed-demo", "ktas-2019")


def _need_shared():
    for name in OPEN:
        absent = [f["path"] for f in load_manifest(name)["files"] if file_checksum_status(f) != "ok"]
        if absent:
            pytest.skip(f"{name}: shared files absent or changed under {data_root()} ({absent}); set TRIAGE_CF_DATA")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def _serve_copy(entry: dict, srv: Path, corrupt: bool = False) -> Path:
    "Copy the shared file of a download entry to the server folder under the URL's path (gzip-compressed if declared)."
    data = (Path(data_root()) / entry["path"]).read_bytes()
    if corrupt:
        data = data[:-200] + b"0" * 200  # same size, other bytes: a corrupted transfer
    dest = srv / urlsplit(entry["url"]).path.lstrip("/")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(_gz(data) if entry["compression"] == "gzip" else data)
    return dest


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A `python -m http.server` process serving a folder of copies of the shared open files; yields (base URL, folder,
    manifest folder, request log). The test manifests are the real ones, except that a gzip download's sha256 is the one
    of the gzip made here (the upstream .gz bytes are not in the shared data, only their decompressed CSVs, whose
    pinned sha256 the fetch still checks)."""
    _need_shared()
    tmp = tmp_path_factory.mktemp("fetch")
    srv, mdir = tmp / "srv", tmp / "manifests"
    mdir.mkdir()
    for name in OPEN:
        m = yaml.safe_load((manifest_dir() / f"{name}.yaml").read_text())
        for e in m["download"]:
            served = _serve_copy({**e, "compression": e.get("compression")}, srv)
            e["sha256"] = sha256_file(served)
        (mdir / f"{name}.yaml").write_text(yaml.safe_dump(m, sort_keys=False))
    port = _free_port()
    log = open(tmp / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(srv)],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120   # a loaded 2-core CI machine can take seconds to start an interpreter
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"the local http.server did not start (exit code {proc.poll()}; log: "
                            f"{(tmp / 'server.log').read_text()[-500:]!r})")
            time.sleep(0.2)
    yield f"http://127.0.0.1:{port}", srv, mdir, tmp / "server.log"
    proc.terminate()
    proc.wait(timeout=10)
    log.close()


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.delenv(FETCH_BASE_URL_ENV, raising=False)


def _gets(log: Path) -> int:
    time.sleep(0.2)  # the server flushes its log line after answering
    return log.read_text().count('"GET ')


def test_manifest_download_pins_are_upstream_and_shared():
    "The real manifests' pins: gzip downloads = PhysioNet's upstream SHA256SUMS, placed files = the shared SHA256SUMS."
    shared = Path(data_root())
    sums = shared / "SHA256SUMS"
    if not sums.exists():
        pytest.skip(f"no {sums}")
    placed = dict(tuple(reversed(l.split())) for l in sums.read_text().splitlines() if l.strip())
    upstream = {}
    for f in ("mimic-iv-ed-demo-2.2/SHA256SUMS.upstream.txt", "mimic-iv-demo-2.2/SHA256SUMS.txt"):
        for line in (shared / f).read_text().splitlines():
            sha, rel = line.split()
            upstream[f.split("/")[0].replace("-2.2", "") + "/" + rel] = sha
    n = 0
    for name in OPEN:
        for e in download_plan(load_manifest(name)):
            assert placed[e["path"]] == e["target_sha256"], e["path"]
            if "physionet.org" in e["url"]:
                project, rel = urlsplit(e["url"]).path.split("/files/")[1].split("/2.2/")
                assert upstream[f"{project}/{rel}"] == e["sha256"], e["url"]
                n += 1
    assert n == 3


def test_fetch_places_verifies_and_loads(server, tmp_path):
    base, srv, mdir, log = server
    root = tmp_path / "data"
    done = fetch_dataset(mdir / "mimic-iv-ed-demo.yaml", data_root=root, base_url=base)
    assert done == {"mimic-iv-ed-demo-2.2/ed/edstays.csv": "fetched", "mimic-iv-ed-demo-2.2/ed/triage.csv": "fetched",
                    "mimic-iv-demo-2.2/hosp/patients.csv.gz": "fetched"}
    m = load_manifest("mimic-iv-ed-demo")
    for f in m["files"]:
        assert sha256_file(root / f["path"]) == f["sha256"], f["path"]
    assert not list(root.rglob(".*.part"))
    rec, _ = load_records(m, root=root)
    assert len(rec) == 222
    # present files are not downloaded again: no request reaches the server
    before = _gets(log)
    assert set(fetch_dataset(mdir / "mimic-iv-ed-demo.yaml", data_root=root, base_url=base).values()) == {"present"}
    assert _gets(log) == before
    # a placed file whose bytes changed is set aside (kept, never read) and fetched again
    (root / "mimic-iv-ed-demo-2.2/ed/triage.csv").write_bytes(b"subject_id,stay_id\n1,2\n")
    again = fetch_dataset(mdir / "mimic-iv-ed-demo.yaml", data_root=root, base_url=base)
    assert again["mimic-iv-ed-demo-2.2/ed/triage.csv"] == "replaced"
    assert (root / "mimic-iv-ed-demo-2.2/ed/triage.csv.sha256-mismatch").read_bytes() == b"subject_id,stay_id\n1,2\n"
    assert sha256_file(root / "mimic-iv-ed-demo-2.2/ed/triage.csv") == m["files"][1]["sha256"]


def test_corrupted_download_refused_then_refetched(server, tmp_path, monkeypatch):
    base, srv, mdir, log = server
    root = tmp_path / "data"
    entry = next(e for e in yaml.safe_load((mdir / "mimic-iv-ed-demo.yaml").read_text())["download"]
                 if e["path"].endswith("triage.csv"))
    good = (srv / urlsplit(entry["url"]).path.lstrip("/")).read_bytes()
    _serve_copy(entry, srv, corrupt=True)
    monkeypatch.setenv(FETCH_BASE_URL_ENV, base)  # the mirror from the environment
    try:
        with pytest.raises(ValueError) as e:
            fetch_dataset(mdir / "mimic-iv-ed-demo.yaml", data_root=root)
        msg = str(e.value)
        assert "mimic-iv-ed-demo-2.2/ed/triage.csv" in msg and "refused" in msg and "sha256 mismatch" in msg
        assert base in msg and entry["sha256"] in msg
        ed = root / "mimic-iv-ed-demo-2.2" / "ed"
        assert not (ed / "triage.csv").exists() and not (ed / "triage.csv.gz").exists()  # nothing of it placed
        (srv / urlsplit(entry["url"]).path.lstrip("/")).write_bytes(good)             # fixed on the server
        before = _gets(log)
        done = fetch_dataset(mdir / "mimic-iv-ed-demo.yaml", data_root=root)
    finally:
        (srv / urlsplit(entry["url"]).path.lstrip("/")).write_bytes(good)
    assert done["mimic-iv-ed-demo-2.2/ed/triage.csv"] == "fetched"
    assert done["mimic-iv-ed-demo-2.2/ed/edstays.csv"] == "present"  # placed by the first, refused call
    assert _gets(log) == before + 2  # triage.csv.gz and patients.csv.gz (not reached by the refused call)
    assert sha256_file(ed / "triage.csv") == load_manifest("mimic-iv-ed-demo")["files"][1]["sha256"]


def test_cli_fetch_ktas(server, tmp_path, capsys):
    base, srv, mdir, log = server
    root = tmp_path / "data"
    rc = main(["fetch", "--dataset", str(mdir / "ktas-2019.yaml"), "--data-root", str(root), "--base-url", base])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "fetched   ktas-moon-2019/emergency_service_triage_pt.csv" in out
    assert sha256_file(root / "ktas-moon-2019/emergency_service_triage_pt.csv") == load_manifest("ktas-2019")["files"][0]["sha256"]
    rc = main(["fetch", "--dataset", str(mdir / "ktas-2019.yaml"), "--data-root", str(root), "--base-url", base])
    assert rc == 0 and "present   ktas-moon-2019" in capsys.readouterr().out


def test_credentialed_and_restricted_refused_with_guidance(tmp_path, capsys):
    root = tmp_path / "data"
    rc = main(["fetch", "--dataset", "mimic-iv-ed", "--data-root", str(root)])
    err = capsys.readouterr().err
    assert rc == 3
    assert "credentialed" in err and "https://physionet.org/settings/credentialing/" in err
    for f in load_manifest("mimic-iv-ed")["files"]:
        assert f"{root / f['path']}  <- {f['url']}" in err
    with pytest.raises(AccessNotOpen, match="data office"):
        fetch_dataset("chu-bordeaux", data_root=root)
    assert not root.exists() or not any(root.rglob("*"))  # nothing downloaded or created
    assert main(["fetch", "--dataset", "synth-fr", "--data-root", str(root)]) == 0
    assert "nothing to fetch" in capsys.readouterr().out


def test_unreachable_source_is_a_clear_error(tmp_path):
    port = _free_port()  # nothing listens there
    with pytest.raises(ValueError, match=r"refused: ConnectionError"):
        fetch_dataset("ktas-2019", data_root=tmp_path, base_url=f"http://127.0.0.1:{port}")
    assert not any(tmp_path.rglob("*.csv"))
