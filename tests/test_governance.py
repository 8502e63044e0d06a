"""Data governance. A fake restricted dataset (the chu-bordeaux schema) seeded with canary strings and ids
runs through the whole chain with the network disabled: no canary reaches a rendered file, count cells are
suppressed, and nothing tries the network. A stage that prints a canary fails the render, naming the output and the
cell. `make docs` refuses run folders and notebooks of non-open datasets. CI refuses tracked run and data files."""
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import nbformat
import pandas as pd
import pytest
import yaml

from triage_cf.core import sha256_file

REPO = Path(__file__).resolve().parents[1]
from triage_cf.chain import stage_notebook, stages_for
from triage_cf.core import load_params
STAGES = stages_for(load_params("chu-bordeaux", "smoke"))  # the whole chain of the profile the tests run
CANARY = "KANARI"          # every free-text canary holds it; ids are BDX + 7 digits
ID_PREFIX = "BDX0"
N = 60
DEAD_PROXY = "http://127.0.0.1:9"

BORDEAUX_COLS = ["id_passage", "date_entree", "saturation_su", "age", "sexe", "motif_code", "motif_libelle",
                 "histoire_maladie", "antecedents", "fc", "fr", "pas", "pad", "spo2", "temperature", "glasgow", "eva",
                 "ide_sexe", "ide_experience_annees", "ide_formation_tri", "cimu"]


def _row(i):
    return dict(
        id_passage=f"BDX{i:07d}", date_entree=f"2018-{1 + i % 12:02d}-{1 + i % 28:02d} {i % 24:02d}:{i % 60:02d}",
        saturation_su="1.2", age=str(25 + i % 60), sexe="F" if i % 2 else "H", motif_code="R07",
        motif_libelle="Douleur thoracique" if i % 7 else f"Motif inhabituel {CANARY}{i:04d}CC tout à fait rare",
        histoire_maladie=f"Douleur thoracique constrictive depuis {1 + i % 5} heures, {CANARY}{i:04d}HPI, irradiation "
                         "vers la mâchoire avec sueurs",
        antecedents=f"HTA, diabète de type 2, {CANARY}{i:04d}PMH, tabagisme ancien sevré",
        fc="80", fr="16", pas="130", pad="80", spo2="98", temperature="37,1", glasgow="15", eva="4",
        ide_sexe="F" if i % 3 else "H", ide_experience_annees="6", ide_formation_tri="1", cimu=str(2 + i % 4))


def _fake_bordeaux_rows():
    rows = [_row(i) for i in range(N)]
    rows[0]["date_entree"] = "2015-06-01 10:00"                                   # date window
    rows[1]["age"] = "16"                                                         # minor
    rows[2]["motif_libelle"] = "Corps étranger des voies génito-urinaires"          # sex-specific class
    rows[3]["histoire_maladie"] = f"Patiente enceinte, douleur abdominale {CANARY}0003HPI depuis hier soir"
    rows[4]["fc"] = "tachy"                                                       # unparseable, counted
    rows[6]["cimu"] = rows[7]["cimu"] = "1"                                       # level 1 excluded
    return rows


def _net_guard(folder: Path) -> Path:
    """An env-activated sitecustomize: with TRIAGE_CF_NET_LOG set, every Python process (the papermill kernels too)
    logs and refuses any inet connect and any name lookup. ZMQ (the kernel's channels) is C code and never passes here."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text('''
import os, socket, sys
_log = os.environ.get("TRIAGE_CF_NET_LOG")
if _log:
    with open(_log + ".active", "a") as f:
        f.write(f"{os.getpid()} {' '.join(getattr(sys, 'orig_argv', sys.argv)[:4])}\\n")
    def _record(what):
        with open(_log, "a") as f:
            f.write(f"{os.getpid()} {what}\\n")
    _connect, _connect_ex, _gai = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo
    def connect(self, addr):
        if self.family != socket.AF_UNIX:
            _record(f"connect {addr!r}")
            raise OSError("network disabled (TRIAGE_CF_NET_LOG)")
        return _connect(self, addr)
    def connect_ex(self, addr):
        if self.family != socket.AF_UNIX:
            _record(f"connect_ex {addr!r}")
            return 111
        return _connect_ex(self, addr)
    def getaddrinfo(host, *a, **k):
        _record(f"getaddrinfo {host!r}")
        raise socket.gaierror("network disabled (TRIAGE_CF_NET_LOG)")
    socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo = connect, connect_ex, getaddrinfo
''')
    return folder


def _offline_env(tmp: Path) -> dict:
    guard = _net_guard(tmp / "netguard")
    env = {"TRIAGE_CF_NET_LOG": str(tmp / "net.log"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp / "hf-home"), "NO_PROXY": "", "no_proxy": "",
           "PYTHONPATH": os.pathsep.join([str(guard), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        env[k] = DEAD_PROXY
    return env


def _repo_copy(root: Path, data: Path) -> None:
    """A copy of the compendium's configuration (TRIAGE_CF_ROOT) whose chu-bordeaux manifest pins the fake file."""
    (root / "nbs").mkdir(parents=True)
    shutil.copy(REPO / "settings.ini", root / "settings.ini")
    shutil.copytree(REPO / "params", root / "params")
    shutil.copytree(REPO / "data_manifest", root / "data_manifest")
    for s in STAGES:
        nb = next((REPO / "nbs").glob(f"*/stages/{s}.ipynb"))
        (root / nb.relative_to(REPO)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(nb, root / nb.relative_to(REPO))
    m = yaml.safe_load((REPO / "data_manifest" / "chu-bordeaux.yaml").read_text(encoding="utf-8"))
    f = data / m["files"][0]["path"]
    f.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(_fake_bordeaux_rows(), columns=BORDEAUX_COLS).to_csv(f, sep=";", index=False)
    m["files"][0]["sha256"] = sha256_file(f)
    (root / "data_manifest" / "chu-bordeaux.yaml").write_text(yaml.safe_dump(m, allow_unicode=True, sort_keys=False), encoding="utf-8")


@pytest.fixture(scope="module")
def restricted_run(tmp_path_factory):
    """The whole chain on the fake restricted dataset, with hub and proxies disabled and a socket guard in every
    Python process (kernels included) and in this one."""
    from triage_cf.chain import reproduce
    tmp = tmp_path_factory.mktemp("governance")
    root, data = tmp / "repo", tmp / "data"
    _repo_copy(root, data)
    env = {"TRIAGE_CF_ROOT": str(root), "TRIAGE_CF_DATA": str(data), "TRIAGE_CF_RUNS": str(tmp / "runs"), **_offline_env(tmp)}
    log = Path(env["TRIAGE_CF_NET_LOG"])
    attempts = []

    def refuse(name, orig):
        def guarded(self, addr, *a):
            if self.family != socket.AF_UNIX:
                attempts.append(f"{name} {addr!r}")
                raise OSError("network disabled")
            return orig(self, addr, *a)
        return guarded

    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        mp.setattr(socket.socket, "connect", refuse("connect", socket.socket.connect))
        mp.setattr(socket.socket, "connect_ex", refuse("connect_ex", socket.socket.connect_ex))
        results = reproduce("chu-bordeaux", "smoke", quiet=True)
        out = tmp / "runs" / "chu-bordeaux" / "smoke"
        yield {"out": out, "root": root, "tmp": tmp, "env": env, "results": results, "log": log, "attempts": attempts}


def _rendered(out: Path):
    return [p for p in sorted(out.rglob("*")) if p.is_file() and p.relative_to(out).parts[0] != "data"]


def _canary_ids(out: Path) -> list[str]:
    return pd.read_parquet(out / "data" / "records.parquet")["record_id"].tolist()


def test_restricted_chain_renders_no_canary(restricted_run):
    out = restricted_run["out"]
    assert [r.status for r in restricted_run["results"]] == ["ran"] * len(STAGES)
    rec = pd.read_parquet(out / "data" / "records.parquet")
    assert len(rec) == N and rec["hpi"].str.contains(CANARY).sum() == N        # the canaries were loaded
    run = json.loads((out / "run.json").read_text())
    assert run["access"] == "restricted" and all(run["stages"][s]["scan"]["mode"] == "enforce" for s in STAGES)
    for s in STAGES:                                                            # everything was rendered
        assert (out / "notebooks" / f"{s}.ipynb").exists() and (out / "html" / f"{s}.html").exists()
    assert (out / "report.html").exists() and (out / "tables" / "table1_cohort.csv").exists()
    assert not list((out / "data" / "_executed").glob("*.ipynb"))             # moved out once scanned
    ids = _canary_ids(out)
    files = _rendered(out)
    assert len(files) >= 20
    for p in files:                                                             # grep every file outside data/
        b = p.read_bytes()
        assert CANARY.encode() not in b, p
        assert not [i for i in ids if i.encode() in b], p


def test_restricted_tables_suppress_small_cells(restricted_run):
    from triage_cf.governance import AccessPolicy, check_table
    out = restricted_run["out"]
    pol = AccessPolicy("chu-bordeaux", "restricted")
    for csv in sorted((out / "tables").glob("*.csv")):
        assert check_table(csv, csv.name, pol) == [], csv
    flow = pd.read_csv(out / "tables" / "cohort_flow.csv", dtype=str, keep_default_na=False)
    assert "<10" in set(flow["n_removed"]) and flow["n_in"].iloc[0] == str(N)
    exact = pd.read_csv(out / "data" / "tables" / "cohort_flow.csv")              # the exact table stays in data/
    assert exact["n_removed"].between(1, 9).any() and exact["n_in"].iloc[0] == N
    # displays in the kernel went through the policy too: 01_data's data_quality (hr unparseable: 1 record)
    nb = nbformat.read(out / "notebooks" / "01_data.ipynb", as_version=4)
    texts = [str(o.get("data", {}).get("text/plain", "")) for c in nb.cells for o in c.get("outputs", [])]
    assert any("unparseable" in t and "<10" in t for t in texts)
    t1 = dict(pd.read_csv(out / "tables" / "table1_cohort.csv").values)
    assert t1["Total visits"] == str(len(pd.read_parquet(out / "data" / "cohort.parquet")))


def test_no_network_during_the_chain(restricted_run):
    log = restricted_run["log"]
    active = Path(str(log) + ".active").read_text()
    assert "ipykernel_launcher" in active                                     # the guard ran inside the kernels
    assert not log.exists(), log.read_text()                                  # ... and nothing tried the network
    assert restricted_run["attempts"] == []                                   # nor in the chain's own process


def test_network_guard_catches_attempts_and_hub_is_offline(tmp_path):
    "The guard is not vacuous: a connection attempt is logged; the package keeps the HF hub offline without asking."
    env = {**os.environ, **_offline_env(tmp_path)}
    env.pop("HF_HUB_OFFLINE"), env.pop("TRANSFORMERS_OFFLINE"), env.pop("HF_DATASETS_OFFLINE")
    code = """
import triage_cf.core  # sets HF_HUB_OFFLINE before any hub library is imported
from huggingface_hub import hf_hub_download
try:
    hf_hub_download("some-org/some-model", "config.json")
except Exception as e:
    print("hub refused:", type(e).__name__)
else:
    raise SystemExit("the hub answered")
"""
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "hub refused" in p.stdout, p.stderr[-2000:]
    log = Path(env["TRIAGE_CF_NET_LOG"])
    assert not log.exists(), log.read_text()
    p = subprocess.run([sys.executable, "-c", "import urllib.request; urllib.request.urlopen('http://example.org', timeout=2)"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and log.exists() and log.read_text().strip()


LEAK = [("code", 'dataset = "chu-bordeaux"\nprofile = "smoke"\nrun_dir = None\nseed = 42\n', ["parameters"]),
        ("code", "from triage_cf.chain import stage_setup\nfrom triage_cf.core import read_parquet, write_table\n"
                 "paths = stage_setup('zz_leak', dataset, profile, run_dir, seed)\n"
                 "records = read_parquet(paths.data / 'records.parquet')"),
        ("code", "records.head()"),                                       # withheld by the kernel's display policy
        ("code", "print('first note:', records['hpi'].iloc[0])"),           # a leak
        ("code", "write_table(records[['record_id']].head(3), paths.tables, 'leak')")]  # a row-level table


def test_stage_printing_a_canary_fails_the_render(restricted_run, tmp_path):
    from triage_cf.chain import StageFailed, reproduce
    out = tmp_path / "run"
    shutil.copytree(restricted_run["out"], out)
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    for kind, src, *tags in LEAK:
        c = nbformat.v4.new_code_cell(src)
        if tags:
            c.metadata["tags"] = tags[0]
        nb.cells.append(c)
    nbformat.write(nb, restricted_run["root"] / "nbs" / "1_audit" / "stages" / "zz_leak.ipynb")
    with pytest.raises(StageFailed) as ei:
        reproduce("chu-bordeaux", "smoke", out=out, quiet=True, stages=STAGES + ["zz_leak"])
    msg = str(ei.value)
    # papermill inserts its injected-parameters cell after the parameters cell: the print is cell 4, head() cell 3
    assert "render blocked" in msg and "restricted dataset 'chu-bordeaux'" in msg
    assert "notebooks/zz_leak.ipynb cell 4 [In " in msg and "output 0 (stdout), line 1: free text of field 'hpi'" in msg
    assert "html/zz_leak.html line" in msg
    assert "tables/leak.csv column 'record_id': row-level table" in msg and "tables/leak.csv line 2: record_id of a record" in msg
    assert "cell 3" not in msg                                                # the displayed frame was withheld
    assert CANARY not in msg and ID_PREFIX not in msg                         # the error names places, never values
    run = json.loads((out / "run.json").read_text())
    assert run["stages"]["zz_leak"]["status"] == "failed" and run["stages"]["15_report"]["status"] == "ok"
    assert CANARY not in json.dumps(run) and ID_PREFIX not in json.dumps(run)
    # nothing of the stage is rendered; the unscanned execution and the leaking table stay under data/
    assert not (out / "notebooks" / "zz_leak.ipynb").exists() and not (out / "html" / "zz_leak.html").exists()
    assert not (out / "tables" / "leak.csv").exists() and (out / "data" / "_quarantine" / "tables" / "leak.csv").exists()
    executed = (out / "data" / "_executed" / "zz_leak.ipynb").read_text()
    assert CANARY in executed and "record-level table withheld" in executed
    ids = _canary_ids(out)
    for p in _rendered(out):
        b = p.read_bytes()
        assert CANARY.encode() not in b and not [i for i in ids if i.encode() in b], p


# ---------------------------------------------------------------- make docs: open and synthetic data only

def _run_folder(tmp_path, dataset, **extra):
    d = tmp_path / dataset
    d.mkdir()
    (d / "run.json").write_text(json.dumps({"dataset": dataset, **extra}))
    (d / "report.html").write_text("<html></html>")
    return d


def test_docs_refuse_restricted_and_credentialed_runs(tmp_path, restricted_run):
    from triage_cf import docs
    for ds in ("chu-bordeaux", "mimic-iv-ed"):
        with pytest.raises(PermissionError, match=rf"refuses run folder .*{ds}.*access level '(restricted|credentialed)'"):
            docs.check_run_is_public(_run_folder(tmp_path, ds))
    assert docs.check_run_is_public(_run_folder(tmp_path, "ktas-2019")) == "ktas-2019"
    with pytest.raises(PermissionError, match="no manifest"):
        docs.check_run_is_public(_run_folder(tmp_path, "someone-elses-data"))
    with pytest.raises(PermissionError, match="no readable run.json"):
        docs.check_run_is_public(tmp_path)
    # the real restricted run folder of the chain: `make docs RUNS=...` exits 2 and writes nothing
    site = tmp_path / "site"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRIAGE_CF_ROOT", str(restricted_run["root"]))
        assert docs.main(["--run", str(restricted_run["out"]), "--out", str(site)]) == 2
    assert not site.exists()


def test_docs_refuse_notebooks_defaulting_to_protected_data(tmp_path):
    from triage_cf import docs
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    cell = nbformat.v4.new_code_cell('dataset = "chu-bordeaux"\nprofile = "smoke"')
    cell.metadata["tags"] = ["parameters"]
    nb.cells.append(cell)
    nbformat.write(nb, tmp_path / "x.ipynb")
    with pytest.raises(PermissionError, match=r"default dataset 'chu-bordeaux' has access level 'restricted'"):
        docs.check_notebook_is_public(tmp_path / "x.ipynb")
    for stage in STAGES:                                    # the shipped stage notebooks default to synthetic data
        assert docs.check_notebook_is_public(stage_notebook(stage)) is not None


# ---------------------------------------------------------------- CI: .ci/check_clean.sh

def _ci_repo(tmp_path):
    """A git repository with the real .ci/check_clean.sh and a .venv/bin whose nbdev commands are no-ops, so the
    script's own checks (tracked data/run files, data-root bytes, notebook outputs) are what is exercised."""
    repo = tmp_path / "ci"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy(REPO / ".ci" / "check_clean.sh", repo / ".ci" / "check_clean.sh")
    shutil.copy(REPO / ".gitignore", repo / ".gitignore")
    b = repo / ".venv" / "bin"
    b.mkdir(parents=True)
    (b / "python").symlink_to(sys.executable)
    for tool in ("nbdev_export", "nbdev_clean"):
        (b / tool).write_text("#!/bin/sh\nexit 0\n")
        (b / tool).chmod(0o755)
    (repo / "README.md").write_text("x\n")
    git = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True)
    git("init", "-q")
    git("add", "README.md", ".gitignore", ".ci/check_clean.sh")
    return repo, git


def _check_clean(repo, **env):
    e = {k: v for k, v in os.environ.items() if k != "TRIAGE_CF_DATA"} | env
    return subprocess.run(["bash", ".ci/check_clean.sh"], cwd=repo, capture_output=True, text=True, env=e, timeout=120)


def test_ci_fails_on_tracked_run_or_data_files(tmp_path):
    repo, git = _ci_repo(tmp_path)
    assert _check_clean(repo).returncode == 0, _check_clean(repo).stdout      # clean repository passes
    leak = repo / "runs" / "chu-bordeaux" / "smoke" / "tables" / "table1_cohort.csv"
    leak.parent.mkdir(parents=True)
    leak.write_text("characteristic,value\n")
    git("add", "-f", str(leak.relative_to(repo)))                            # gitignored, force-added
    p = _check_clean(repo)
    assert p.returncode == 1 and "data, run or built-docs files are tracked" in p.stdout
    assert "runs/chu-bordeaux/smoke/tables/table1_cohort.csv" in p.stdout
    git("rm", "-q", "--cached", str(leak.relative_to(repo)))
    assert _check_clean(repo).returncode == 0
    # a tracked file with the bytes of a file under the data root (outside the repository)
    data = tmp_path / "data-root" / "chu-bordeaux"
    data.mkdir(parents=True)
    (data / "passages.csv").write_text("id_passage;cimu\nBDX0000001;3\n")
    (repo / "fixture.csv").write_text("id_passage;cimu\nBDX0000001;3\n")
    git("add", "fixture.csv")
    p = _check_clean(repo, TRIAGE_CF_DATA=str(tmp_path / "data-root"))
    assert p.returncode == 1 and "same bytes as a file under the data root" in p.stdout
    git("rm", "-q", "--cached", "fixture.csv")
    # a committed notebook with outputs
    nb = nbformat.v4.new_notebook()
    c = nbformat.v4.new_code_cell("1 + 1", execution_count=1)
    c.outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": "2"}, execution_count=1)]
    nb.cells.append(c)
    (repo / "nbs").mkdir()
    nbformat.write(nb, repo / "nbs" / "x.ipynb")
    git("add", "nbs/x.ipynb")
    p = _check_clean(repo)
    assert p.returncode == 1 and "committed notebooks carry outputs: nbs/x.ipynb" in p.stdout
