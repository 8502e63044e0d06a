"""Runs survive crashes: `triage-cf reproduce` on synth-en (smoke profile) is SIGKILLed during fine-tuning
(stage 05_emulator, after its first epoch checkpoint) and, on the re-run, during prediction (stage 08_predict, after
its first durable chunk); a third run finishes. Only unfinished work is redone (earlier stages skipped, fine-tuning
resumed from the checkpoint, prediction chunks reused) and the tables and prediction files are byte-identical to an
uninterrupted run in another folder (tests/_smoke_runs.py)."""
import json
import re

import pytest

import _smoke_runs as sr
from triage_cf.chain import stages_for
from triage_cf.core import load_params
from triage_cf.core import VIEWS

STAGES = stages_for(load_params(sr.DATASET, sr.PROFILE))
FT, PRED = "05_emulator", "08_predict"


def _stat(paths) -> dict:
    "(inode, mtime_ns, size) of files: a rewritten file (atomic rename) gets a new inode and mtime."
    return {p: (p.stat().st_ino, p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(paths)}


def _run_json(out):
    return json.loads((out / "run.json").read_text())


def _stage_stream(nb_path, marker: str | None = None) -> str:
    """Text output (stdout and stderr) of the stage cells of an executed stage notebook (after its parameters cell);
    with `marker`, of the stage cells whose source contains it only."""
    nb = json.loads(nb_path.read_text())
    tags = [c.get("metadata", {}).get("tags", []) for c in nb["cells"]]
    first = max(i for i, t in enumerate(tags) if "parameters" in t or "injected-parameters" in t)
    return "".join("".join(o.get("text", "")) for c in nb["cells"][first + 1:] if c["cell_type"] == "code"
                   and (marker is None or marker in "".join(c["source"]))
                   for o in c.get("outputs", []) if o.get("output_type") == "stream")


@pytest.fixture(scope="module")
def crash(tmp_path_factory, request):
    sr.start_uninterrupted("first", tmp_path_factory)  # the reference, computed meanwhile
    if sr.session_runs_module(request, "test_reproducible.py"):
        sr.start_uninterrupted("second", tmp_path_factory)
    out = tmp_path_factory.mktemp("crash") / "run"
    ck_root = out / "data" / "models" / "ft_work"
    pred_root = out / "data" / "predictions" / "FT"
    info = {"out": out}

    # (a) killed during fine-tuning: the first epoch checkpoint is committed (LATEST.json), the stage is not finished
    p = sr.start_chain(out, "a")
    latest = sr.kill_when(p, lambda: next(iter(sorted(ck_root.glob("*/checkpoints/LATEST.json"))), None),
                          "a committed epoch checkpoint of the fine-tune")
    info["a"] = dict(run=_run_json(out), latest=json.loads(latest.read_text()), statuses=sr.stage_statuses(sr.log_text(p)),
                     checkpoints=_stat(f for f in latest.parent.rglob("*") if f.is_file() and f.name != "LATEST.json"),
                     emulator_saved=(out / "data" / "models" / "ft" / "emulator.json").exists(), ck_dir=latest.parent)

    # (b) the re-run, killed during prediction: one durable chunk is written, the stage is not finished
    p = sr.start_chain(out, "b")
    chunk = sr.kill_when(p, lambda: next(iter(sorted(pred_root.rglob("chunk-*.parquet"))), None),
                         "a durable prediction chunk of stage 08_predict")
    info["b"] = dict(run=_run_json(out), statuses=sr.stage_statuses(sr.log_text(p)), first_chunk=chunk,
                     chunks=_stat(pred_root.rglob("chunk-*.parquet")),
                     ft_written=(out / "data" / "predictions" / "FT.parquet").exists())

    # (c) the last run finishes
    p = sr.wait_chain(sr.start_chain(out, "c"))
    info["c"] = dict(run=_run_json(out), statuses=sr.stage_statuses(sr.log_text(p)))
    return info


def test_kills_landed_inside_the_stages(crash):
    a, b = crash["a"], crash["b"]
    assert a["run"]["stages"][FT]["status"] == "running", a["run"]["stages"][FT]
    assert a["latest"] == {"checkpoint": "epoch-001"}, "the kill should land after the first epoch and before the second"
    assert not a["emulator_saved"]
    assert b["run"]["stages"][PRED]["status"] == "running", b["run"]["stages"][PRED]
    assert not b["ft_written"]
    # both sides of every pair in every view have their chunk folder: at the kill, some had none yet
    assert 1 <= len({f.parent for f in b["chunks"]}) < 2 * len(VIEWS), f"{len(b['chunks'])} chunks at the kill: no work left"


def test_the_chain_finishes_after_two_kills(crash):
    run = crash["c"]["run"]
    assert {s: run["stages"][s]["status"] for s in STAGES} == {s: "ok" for s in STAGES}
    assert (crash["out"] / "report.html").exists()


def test_only_unfinished_work_is_redone(crash):
    before_ft = STAGES[:STAGES.index(FT)]
    before_pred = STAGES[:STAGES.index(PRED)]
    # after kill (a): the stages before the fine-tune are skipped, the fine-tune and the next stages run
    st = crash["b"]["statuses"]
    assert [st.get(s) for s in before_ft] == ["skipped"] * len(before_ft), st
    assert [st.get(s) for s in STAGES[STAGES.index(FT):STAGES.index(PRED)]] == ["ran"] * (len(before_pred) - len(before_ft)), st
    # after kill (b): everything before the prediction stage is skipped; it and the later stages run
    st = crash["c"]["statuses"]
    assert [st.get(s) for s in STAGES] == ["skipped"] * len(before_pred) + ["ran"] * (len(STAGES) - len(before_pred)), st
    # run.json says which attempts resumed an interrupted one
    assert crash["c"]["run"]["stages"][FT].get("resumed_from") == crash["a"]["run"]["stages"][FT]["started"]
    assert crash["c"]["run"]["stages"][PRED].get("resumed_from") == crash["b"]["run"]["stages"][PRED]["started"]


def test_fine_tuning_resumed_from_its_checkpoint(crash, tmp_path_factory):
    a, out = crash["a"], crash["out"]
    # the epoch-1 checkpoint written before the kill is the one kept: a fine-tune from scratch deletes the checkpoints
    # and writes epoch 1 again (new inode and mtime)
    assert a["checkpoints"] and _stat(a["checkpoints"]) == a["checkpoints"]
    assert json.loads((a["ck_dir"] / "LATEST.json").read_text()) == {"checkpoint": "epoch-002"}
    # the resumed stage trained epoch 2 only; the uninterrupted run trained epochs 1 and 2 (the FT model's cell: the
    # null twin of the null control trains after it, from scratch in both runs)
    ft_cell = 'fine_tune(train, "ft", '
    resumed = _stage_stream(out / "notebooks" / f"{FT}.ipynb", ft_cell)
    full = _stage_stream(sr.uninterrupted("first", tmp_path_factory) / "notebooks" / f"{FT}.ipynb", ft_cell)
    assert full and resumed
    bar = lambda e, text: re.search(rf"epoch {e}:\s+\d+%", text) is not None  # the fine-tune's tqdm bar
    assert bar(1, full) and bar(2, full)
    assert bar(2, resumed) and not bar(1, resumed)
    # the checkpoint of the killed attempt is recorded among the stage's outputs (a later corruption is detected)
    outputs = crash["c"]["run"]["stages"][FT]["outputs"]
    assert {f.relative_to(out).as_posix() for f in a["checkpoints"]} <= set(outputs)


def test_prediction_chunks_reused(crash):
    b, out = crash["b"], crash["out"]
    assert _stat(b["chunks"]) == b["chunks"], "a prediction chunk written before the kill was computed again"
    after = sorted((out / "data" / "predictions" / "FT").rglob("chunk-*.parquet"))
    assert len({f.parent for f in after}) == 2 * len(VIEWS) and set(b["chunks"]) < set(after)  # both sides x views
    outputs = crash["c"]["run"]["stages"][PRED]["outputs"]
    assert {f.relative_to(out).as_posix() for f in after} <= set(outputs)


def test_outputs_identical_to_an_uninterrupted_run(crash, tmp_path_factory):
    ref = sr.uninterrupted("first", tmp_path_factory)
    digests = sr.assert_same_artifacts(crash["out"], ref)
    assert crash["b"]["first_chunk"].relative_to(crash["out"]).as_posix() in digests
