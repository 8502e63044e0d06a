"""nbdev_test inside pytest, one test per notebook, so the runner's summary counts them.

Every notebook of `nbs/` and its part folders runs (library chapters and stage notebooks). Each stage notebook runs with its default parameters (the smoke profile on a synthetic dataset); its `stage_setup`
brings the earlier stages up to date through the chain first. Run folders go to a temporary runs root."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p.relative_to(REPO / "nbs").as_posix() for p in (REPO / "nbs").rglob("*.ipynb")
                   if not any(x.startswith(("_", ".")) for x in p.relative_to(REPO / "nbs").parts))


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory):
    return tmp_path_factory.mktemp("nbtest-runs")


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook(name, runs_root):
    env = {**os.environ, "TRIAGE_CF_RUNS": str(runs_root), "HF_HUB_OFFLINE": "1"}
    nbdev_test = Path(sys.executable).with_name("nbdev_test")
    p = subprocess.run([str(nbdev_test), "--path", str(REPO / "nbs" / name), "--n_workers", "0"],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=1200)
    assert p.returncode == 0, f"nbdev_test failed for {name}:\n{p.stdout[-4000:]}\n{p.stderr[-6000:]}"
