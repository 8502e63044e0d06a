"""The decision audit of YentlBench (triage_cf.margins.triager): hand-computed McNemar, Cochran's Q and transition
matrix; bad input refused or counted; `triage-cf triager` on a small folder; the 60 real run files when the data root
has them (skipped otherwise)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from triage_cf.cli import main
from triage_cf.margins.triager import (FROM_PROBE_VARIANT, YB_VARIANTS, answers_from_probe, audit_answers,
                                       audit_yentlbench, boundary_crossings, complete_cases, mcnemar_paired,
                                       omnibus_tests, pairwise_table, parse_status_table, read_yentlbench,
                                       transitions_table, write_run_file, write_triager_outputs)

# five vignettes counted by hand (nurse level y; one column per variant)
P = pd.DataFrame({"nb_ambiguous": [2, 2, 3, 2, 3], "female": [3, 3, 3, 2, 4], "male": [2, 2, 2, 2, 3],
                  "nb_label_only": [2, 3, 3, 2, 3]}, index=[f"v{i}" for i in range(1, 6)])
Y = np.array([2, 2, 3, 1, 3])
CASES = [("Chest pain", 2), ("Dyspnea", 3), ("R Leg pain", 3)]


def test_mcnemar_by_hand():
    # female right on v3 only, male right on v1, v2, v5: discordant 1 and 3; exact p = 2 * (1 + 4) / 16
    r = mcnemar_paired(P["female"] == Y, P["male"] == Y)
    assert (r["b01"], r["b10"]) == (1, 3) and r["p"] == pytest.approx(10 / 16)
    # 30 discordant pairs (20 vs 10): chi-square with continuity correction, (|20 - 10| - 1)^2 / 30
    big = mcnemar_paired([True] * 20 + [False] * 10 + [True] * 5, [False] * 20 + [True] * 10 + [True] * 5)
    assert big["statistic"] == pytest.approx(81 / 30) and big["p"] == pytest.approx(stats.chi2.sf(81 / 30, 1))
    pw = pairwise_table(P, Y).set_index(["variant_a", "variant_b"]).loc[("female", "male")]
    # direction: male puts v1, v2, v3 in ESI 1-2 where female does not: 3 crossings of 2-3 to more urgent, p = 2/8
    assert (pw["to_less_urgent_2_3"], pw["to_more_urgent_2_3"]) == (0, 3)
    assert pw["direction_mcnemar_p"] == pytest.approx(0.25)


def test_cochran_q_by_hand():
    # correctness rows 1011, 1010, 1101, 0000, 1011: columns 4, 1, 3, 3; Q = 3 (4*35 - 121) / (44 - 31) = 57/13
    om = omnibus_tests(P, Y)
    assert om["cochran_q"] == pytest.approx(57 / 13)
    assert om["cochran_p"] == pytest.approx(stats.chi2.sf(57 / 13, 3))


def test_transition_matrix_by_hand():
    t = transitions_table(P)
    fm = (t[(t.variant_a == "female") & (t.variant_b == "male")]
          .pivot(index="level_a", columns="level_b", values="count"))
    assert (fm.loc[3, 2], fm.loc[2, 2], fm.loc[4, 3], int(fm.to_numpy().sum())) == (3, 1, 1, 5)
    assert t.groupby(["variant_a", "variant_b"]).ngroups == 6
    bc = boundary_crossings(P).set_index(["variant_a", "variant_b", "boundary"])
    assert bc.loc[("nb_ambiguous", "female", "2-3"), ["to_less_urgent", "to_more_urgent"]].tolist() == [2, 0]


def _folder(tmp_path: Path, levels: dict) -> Path:
    for m, by in levels.items():
        for v, pred in by.items():
            rows = [(c, p, float(a)) for (c, a), p in zip(CASES, pred)]
            write_run_file(tmp_path, m, v, rows[::-1] if v == "female" else rows)    # orders differ across files
    return tmp_path


GOOD = {v: [2, 3, 3] for v in YB_VARIANTS}


def test_bad_input_refused_or_counted(tmp_path):
    (tmp_path / "a").mkdir()
    f = tmp_path / "a" / "batch_esi_triage_scorer_male-run_id_Run_1_m.run.json"
    f.write_text("vignette,level\n1,2\n")
    with pytest.raises(ValueError, match=f"{f.name}: not JSON"):
        read_yentlbench(tmp_path / "a")
    f.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="no 'subruns' list"):
        read_yentlbench(tmp_path / "a")
    # a variant missing for some vignettes: counted per model and variant, those vignettes left out with their count
    (tmp_path / "b").mkdir()
    a = read_yentlbench(_folder(tmp_path / "b", {"m": {**GOOD, "male": [2, 3]}}))
    ps = parse_status_table(a).set_index(["model", "variant"])
    assert ps.loc[("m", "male"), ["n_answers", "n_missing"]].tolist() == [2, 1]
    _, _, row = complete_cases(a, "m")
    assert (row["n_complete"], row["n_excluded"], row["excluded_model"]) == (2, 1, False)
    # a model with no parsable answer: excluded with its reason; the other model is audited
    (tmp_path / "c").mkdir()
    a = read_yentlbench(_folder(tmp_path / "c", {"ok": GOOD, "mute": {v: [None] * 3 for v in YB_VARIANTS}}))
    assert parse_status_table(a).set_index(["model", "variant"]).loc[("mute", "female"), "n_unparsed"] == 3
    res = audit_answers(a, n_boot=20)
    ex = res["exclusions"].set_index("model")
    assert ex.loc["mute", "excluded_model"] and "no usable level" in ex.loc["mute", "reason"]
    assert set(res["ranking"]["model"]) == {"ok"}
    with pytest.raises(ValueError, match="no model has a vignette"):
        audit_answers(a[a["model"] == "mute"], n_boot=20)


def test_cli_writes_one_csv_per_analysis(tmp_path):
    (tmp_path / "runs").mkdir()
    d = _folder(tmp_path / "runs", {"m1": GOOD, "m2": {**GOOD, "female": [3, 3, 2]}})
    out = str(tmp_path / "out")
    assert main(["triager", "--yentlbench", str(d), "--out", out, "--n-boot", "20", "--no-check"]) == 0
    names = {p.stem for p in (tmp_path / "out" / "tables").glob("*.csv")}
    assert {"triager_parse_status", "triager_pairwise", "triager_omnibus", "triager_transitions",
            "triager_ranking", "triager_review_list", "triager_tests", "triager_vignette_match"} <= names
    pw = pd.read_csv(tmp_path / "out" / "tables" / "triager_pairwise.csv")
    assert list(pw.columns[:3]) == ["model", "variant_a", "variant_b"] and len(pw) == 12
    assert (tmp_path / "out" / "figures" / "triager_ranking.png").exists()
    assert main(["triager", "--yentlbench", str(tmp_path / "nothing"), "--out", str(tmp_path / "o2")]) == 2


def _probe_rows(written: dict, decided: dict) -> pd.DataFrame:
    "A probe stage's vignette_metrics rows: the five hand-counted vignettes of P, two stays per patient."
    to_yb = FROM_PROBE_VARIANT
    rows = [{"vignette_id": f"3000{i}", "subject_id": f"p{i // 2}", "true_level": int(Y[i]), "category": "other",
             "variant": pv, "written_level": written[to_yb[pv]][i], "decided_level": decided[to_yb[pv]][i],
             "outcome": "ok", "delta_m": 0.5 + i}
            for i in range(len(Y)) for pv in to_yb]
    return pd.DataFrame(rows)


def test_probe_path_with_levels(tmp_path):
    """The probe stage's path (answers_from_probe -> audit_answers(strict=False) -> write_triager_outputs) with written
    levels gives every table and both figures, and the hand-counted numbers; `decided` reads the other column."""
    written = {v: P[v].tolist() for v in YB_VARIANTS}
    decided = {v: [3] * len(Y) for v in YB_VARIANTS}
    vm = _probe_rows(written, decided)
    dm = {"reference_delta_m": {"m": vm[vm["variant"] == "omitted"].set_index("vignette_id")["delta_m"]}}
    t = audit_answers(answers_from_probe(vm, "m"), n_boot=30, difficulty=dm, strict=False)
    assert {"ranking", "pairwise", "omnibus", "transitions", "tests", "review_list"} <= set(t)
    assert t["omnibus"]["cochran_q"].iloc[0] == pytest.approx(57 / 13)
    assert set(t["difficulty"]["difficulty"]) == {"baseline_error", "reference_delta_m"}
    w = write_triager_outputs(t, tmp_path / "tables", tmp_path / "figures", prefix="margins_triager")
    assert (tmp_path / "figures" / "margins_triager_ranking.png").exists() and "figure_change_heatmap" in w
    d = audit_answers(answers_from_probe(vm, "m", level="decided"), n_boot=30, strict=False)
    assert d["ranking"]["model"].tolist() == ["m (decided level)"]
    assert d["ranking"]["mean_pairwise_disagreement"].iloc[0] == 0.0
    # no written level at all (SmolLM2): the counting tables only, every answer counted as no_level_written
    mute = audit_answers(answers_from_probe(vm.assign(written_level=None), "m"), n_boot=30, strict=False)
    assert set(mute) == {"parse_status", "exclusions"}
    assert mute["parse_status"]["n_no_level_written"].sum() == 4 * len(Y)


REAL = Path(os.environ.get("TRIAGE_CF_DATA", "../shared/data")) / "yentlbench-results" / "results"


@pytest.mark.skipif(not REAL.is_dir(), reason="YentlBench's runs are not under the data root")
def test_the_60_real_files():
    answers, t = audit_yentlbench(REAL, n_boot=50)
    assert len(answers) == 60 * 70 and answers["model"].nunique() == 15 and answers["vignette_id"].nunique() == 70
    assert (t["parse_status"]["n_answers"] == 70).all() and len(t["parse_status"]) == 60
    assert t["exclusions"]["n_complete"].eq(70).all()
    m = t["vignette_match"].iloc[0]
    if not m["remark"]:                                  # the data root has the demo: every vignette is a male stay
        assert (m["n_matched"], m["n_patients"]) == (70, 24)
    assert len(t["ranking"]) == 15 and len(t["pairwise"]) == 15 * 6
    # the nurse's levels of the 70: ESI 1/2/3 = 4/41/25 (as the chain's seed001 vignettes)
    lv = answers.drop_duplicates("vignette_id")["actual_level"].value_counts().to_dict()
    assert lv == {2.0: 41, 3.0: 25, 1.0: 4}


def test_the_data_roots_layout_is_read(tmp_path):
    "A folder whose run files sit in `results/` (YentlBench's repository, the data root) reads as the folder itself."
    (tmp_path / "results").mkdir()
    for v in YB_VARIANTS:
        write_run_file(tmp_path / "results", "m", v, [("chest pain", 2, 2), ("cough", 4, 3)])
    a = read_yentlbench(tmp_path)
    assert len(a) == 2 * len(YB_VARIANTS) and set(a.variant) == set(YB_VARIANTS)
    with pytest.raises(ValueError, match="no \\*.run.json file"):
        read_yentlbench(tmp_path / "results" / "nothing-here")
