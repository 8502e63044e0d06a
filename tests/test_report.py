"""The run's report (nbs/1_audit/13_report.ipynb -> triage_cf/audit/report.py) read as a reader would: every table and figure of the
run exactly once, in the paper's order, summary first, unfit models greyed, figures as embedded PNGs, offline, narrow,
and a valid report for runs that have only some stages (margins, tbias, an older run without the new columns)."""
from __future__ import annotations

import base64
import io
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from triage_cf.core import VIEWS, RunPaths, write_table
from triage_cf.audit.metrics import METRICS, format_table3
from triage_cf.audit.report import SECTIONS, build_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SECRET = "ZZ-patient-note-7f3a"   # record-level text in data/: must never reach the report


def _png() -> bytes:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(2, 1.5))
    ax.plot([0, 1], [0, 1])
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=50)
    plt.close(fig)
    return buf.getvalue()


def _table3(models, nulls: bool, fits: dict | None) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for m in models:
        for v in VIEWS:
            for metric in METRICS:
                e = float(rng.uniform(-0.1, 0.2)) if metric != "NMDF" else float(rng.uniform(-0.01, 0.02))
                r = dict(model=m, condition=v, metric=metric, estimate=round(e, 4), ci_low=round(e - 0.03, 4),
                         ci_high=round(e + 0.03, 4), n_pairs=400, remark="")
                if nulls:
                    twin = m != "FT"
                    r.update(null_estimate=0.002 if twin else "", null_ci_low=-0.01 if twin else "",
                             null_ci_high=0.014 if twin else "", diff_ci_low=round(e - 0.04, 4) if twin else "",
                             diff_ci_high=round(e + 0.02, 4) if twin else "",
                             exceeds_null=(str(e - 0.04 > 0 or e + 0.02 < 0) if twin else ""))
                if fits is not None:
                    r.update(fit_for_audit=fits[m], fitness_reason="" if fits[m] else "kappa_w CI includes the level prior's 0")
                rows.append(r)
    return pd.DataFrame(rows)


def _levels(models, fits) -> tuple[pd.DataFrame, pd.DataFrame]:
    t6, t7 = [], []
    for m in models:
        for lv in (1, 2, 3, 4):
            t6.append(dict(model=m, condition="full", true_level=lv, n_M=20, p_cf_gt_orig_M=0.1, p_cf_lt_orig_M=0.05, n_F=25,
                           p_cf_gt_orig_F=0.08, p_cf_lt_orig_F=0.04, delta_gt_M_minus_F=0.02, delta_lt_M_minus_F=0.01))
            t7.append(dict(model=m, condition="full", true_level=lv, cf_lt_orig_M=3, cf_ge_orig_M=17, cf_lt_orig_F=2,
                           cf_ge_orig_F=23, OR=1.5 if lv > 1 else "-", ci_low=0.9 if lv > 1 else "-",
                           ci_high=2.4 if lv > 1 else "-", p_value=0.03 if lv > 1 else "-"))
    t6, t7 = pd.DataFrame(t6), pd.DataFrame(t7)
    if fits is not None:
        for t in (t6, t7):
            t["fit_for_audit"] = t.model.map(fits)
            t["fitness_reason"] = ""
    return t6, t7


def make_run(root: Path, kind: str) -> RunPaths:
    """A run folder in the stages' formats: `default` (the new table contract), `old` (an older default run without the
    new columns), `margins` (a margins-smoke run), `tbias` (a tbias-smoke run)."""
    p = RunPaths(root).make()
    png = _png()
    tables, figures = {}, ["cohort_flow"]
    tables["table1_cohort"] = pd.DataFrame({"characteristic": ["Total visits", "Language"], "value": ["2,644", "English"]})
    tables["cohort_flow"] = pd.DataFrame({"step": [0, 1], "rule": ["01_data", "min_age"], "description": ["ids", "age < 18"],
                                          "n_in": [3000, 3000], "n_removed": [0, 356], "n_out": [3000, 2644]})
    tables["data_quality"] = pd.DataFrame({"column": ["age"], "issue": ["missing"], "count": [19]})
    tables["exclusion_terms"] = pd.DataFrame({"rule": ["sex_specific_terms"] * 31, "term": [f"t{i}" for i in range(31)],
                                              "n_records": range(31)})
    if kind in ("default", "old"):
        models = ["FT", "FS", "oracle"]
        fits = {"FT": False, "FS": True, "oracle": True} if kind == "default" else None
        tables["table2_performance"] = pd.DataFrame({
            "model": ["RF (TF-IDF)", "FS (RoBERTa from scratch)", "FT (SmolLM2-135M + LoRA)", "oracle (planted)"],
            "parameters": ["", 216068, 1.39e8, ""], "kappa_w": [0.5, 0.24, 0.011, 0.705], "precision": [0.7, 0.49, 0.15, 0.74],
            "n_test": 100, "n_train": [1322, 1322, 48, ""]})
        tables["table3_bias_metrics"] = _table3(models, nulls=kind == "default", fits=fits)
        tables["table6_discordance_by_level"], tables["table7_or_by_level"] = _levels(models, fits)
        tables["pretraining_comparison"] = tables["table3_bias_metrics"].query("metric in ['NATS_up', 'NATS_down'] and condition == 'full' "
                                                                               "and model in ['FT', 'FS']")[["model", "condition", "metric", "estimate", "ci_low", "ci_high", "n_pairs", "remark"]]
        imp = pd.DataFrame({"model": ["FT", "FT", "oracle", "oracle"], "condition": "full", "country": ["France", "United States"] * 2,
                            "annual_ed_visits": [2.09e7, 1.554e8] * 2, "female_share": 0.5, "female_skew": [0.146, 0.146, 0.021, 0.021],
                            "female_skew_ci_low": [0, 0, 0.01, 0.01], "female_skew_ci_high": [0.33, 0.33, 0.032, 0.032],
                            "visits_per_year": [1.5e6, 1.1e7, 219450, 1631700], "visits_ci_low": [0, 0, 104500, 777000],
                            "visits_ci_high": [3.4e6, 2.5e7, 334400, 2486400]})
        if kind == "default":
            imp["reportable"] = imp.model == "oracle"
            imp["remark"] = np.where(imp.reportable, "", "FT not fit for audit")
            imp.loc[~imp.reportable, ["visits_per_year", "visits_ci_low", "visits_ci_high"]] = np.nan
            tables["fitness"] = pd.DataFrame({"model": ["FT", "FS", "RF", "oracle"], "kappa_w": [0.011, 0.24, 0.5, 0.705],
                                              "ci_low": [-0.06, 0.11, 0.41, 0.62], "ci_high": [0.08, 0.37, 0.58, 0.78], "n_test": 100,
                                              "best_baseline": "level prior", "best_baseline_kappa": 0.0,
                                              "fit_for_audit": [False, True, True, True],
                                              "fitness_reason": ["kappa_w CI includes the level prior's 0", "", "", ""]})
            t3 = tables["table3_bias_metrics"]
            tables["null_control"] = t3[t3.model != "FT"][["model", "condition", "metric"]].assign(
                null_seed=1042, estimate=0.002, ci_low=-0.01, ci_high=0.014)
            tables["null_false_positive"] = pd.DataFrame({"model": ["FS", "oracle"], "n_metrics": [33, 33],
                                                          "n_ci_excludes_0": [2, 1], "false_positive_rate": [2 / 33, 1 / 33]})
        tables["impact"] = imp
        tables["split_balance"] = pd.DataFrame({"level": [1, 2], "n_train": [151, 688], "n_test": [152, 688]})
        tables["ft_training"] = pd.DataFrame({"epoch": [1], "train_loss": [3.43], "val_loss": [2.25], "val_acc": [0.4]})
        tables["counterfactual_flow"] = pd.DataFrame({"status": ["ok"], "n_orig_F": [23], "n_orig_M": [17], "n_total": [40]})
        tables["recovery_power"] = pd.DataFrame({"condition": ["both_x1"], "planted": [0.014], "n_for_z_2_8": [35872]})
        tables["zz_unknown_stage"] = pd.DataFrame({"x": [1]})
        figures += ["figure2_kappa_vs_size", "figure3_bias_metrics", "confusion_FT", "confusion_RF", "figure5_distributions",
                    "figure4_audited_models" if kind == "default" else "figure4_pretraining", "recovery", "zz_other"]
    if kind == "margins":
        tables["margins_experiment"] = pd.DataFrame({"backend": ["local"], "model": ["tiny"], "gate_threshold": [1], "n_vignettes": [6],
                                                     "template_sha256": ["fa68dedf1919"], "n_llm_calls": [168], "n_llm_failed": [0],
                                                     "remark": ["a weak triager: the numbers demonstrate the instrument"]})
        tables["margins_delta_m_by_variant"] = pd.DataFrame({"variant": ["female", "male"], "n_vignettes": [6, 6],
                                                             "mean_delta_m": [0.54, 0.80], "delta_m_ci_low": [0.23, 0.43],
                                                             "delta_m_ci_high": [0.88, 1.27]})
        tables["margins_tar"] = pd.DataFrame({"variant": ["female"], "n_calls": [6], "mean_tar": [""], "remark": ["TAR is null"]})
        tables["pm_extra"] = pd.DataFrame({"x": [1]})
        figures += ["margins_delta_m_vs_baseline", "margins_gate_rate", "margins_new_plot"]
    if kind == "tbias":
        tables["tbias_word_bias"] = pd.DataFrame({"model": ["m"] * 2, "language": ["en", "es"], "category": ["risk"] * 2,
                                                  "bias": ["", 0.1], "ci_low": ["", -0.1], "ci_high": ["", 0.3]})
        tables["tbias_word_parse"] = pd.DataFrame({"model": ["m", "m"], "language": ["en", "es"], "invalid_rate": [1.0, 1.0]})
        tables["tbias_allocation"] = pd.DataFrame({"model": ["m"] * 48, "service": [f"s{i}" for i in range(48)],
                                                   "trans_rate": 0.5, "trans_ci_low": 0.2, "trans_ci_high": 0.8,
                                                   "sha": ["bb15f5ebb73e8968c9d9823d1b46246744b479ce339c9d2dc0280317d44a056c"] * 48})
        tables["tbias_explanations"] = pd.DataFrame({"model": ["m"], "response": ["I'm not a person, but " * 40]})
        figures += ["tbias_fig1_word_bias", "tbias_fig2_selection_en_selection", "tbias_fig2_selection_es_symptoms"]
    for name, df in tables.items():
        write_table(df, p.tables, name)
    for f in figures:
        (p.figures / f"{f}.png").write_bytes(png)
    (p.data / "cohort.csv").write_text(f"note\n{SECRET}\n", encoding="utf-8")
    stages = {"default": ["01_data", "02_cohort", "09_metrics", "15_report"], "old": ["01_data", "09_metrics", "15_report"],
              "margins": ["01_data", "02_cohort", "11_margins_vignettes", "12_margins_probe", "15_report"],
              "tbias": ["01_data", "02_cohort", "13_tbias_words", "14_tbias_allocation", "15_report"]}[kind]
    p.run_json.write_text(pd.Series({"dataset": "synth-en", "profile": kind, "git": {"commit": "abc123", "dirty": False},
                                     "parameters": {"seed": 42, "n_boot": 1000},
                                     "stages": {s: {"status": "ok", "wall_s": 1.0} for s in stages}}).to_json(), encoding="utf-8")
    return p


@pytest.fixture(scope="module", params=["default", "old", "margins", "tbias"])
def run(request, tmp_path_factory):
    p = make_run(tmp_path_factory.mktemp(request.param), request.param)
    return request.param, p, build_report(p, f"triage_cf — {request.param}")


def test_every_table_and_figure_exactly_once(run):
    kind, p, h = run
    files = [f"tables/{f.name}" for f in p.tables.glob("*.csv")] + [f"figures/{f.name}" for f in p.figures.glob("*.png")]
    assert len(files) >= 6
    counts = {f: h.count(f"data-source='{f}'") for f in files}
    assert counts == {f: 1 for f in files}
    assert len(re.findall(r"data-source='", h)) == len(files)   # nothing placed that is not in the run


def test_images_are_embedded_pngs(run):
    kind, p, h = run
    srcs = re.findall(r"<img [^>]*src='([^']*)'", h)
    assert len(srcs) == len(list(p.figures.glob("*.png")))
    for s in srcs:
        assert s.startswith("data:image/png;base64,")
        assert base64.b64decode(s.split(",", 1)[1]).startswith(PNG_MAGIC)


def test_offline_and_no_record_data(run):
    kind, p, h = run
    assert "://" not in h and "<script" not in h.lower() and "mathjax" not in h.lower() and "<link" not in h.lower()
    assert SECRET not in h


def test_sections_in_the_papers_order(run):
    kind, p, h = run
    ids = re.findall(r"<section id='([^']+)'", h)
    assert ids == [s for s in SECTIONS if s in ids] and ids[0] == "summary" and ids[-2:] == ["appendix", "parameters"]
    expected = {"default": {"cohort", "performance", "bias", "levels", "pretraining", "impact"},
                "old": {"cohort", "performance", "bias", "levels", "pretraining", "impact"},
                "margins": {"cohort", "margins"}, "tbias": {"cohort", "tbias"}}[kind]
    assert set(ids) - {"summary", "appendix", "parameters"} == expected
    heads = re.findall(r"<h2>(\d+)\. ", h)
    assert heads == [str(i + 1) for i in range(len(heads))]   # the sections this run has, numbered without gaps
    if kind == "default":
        order = ["<b>Table 1:</b>", "<b>Table 2:</b>", "<b>Figure 2:</b>", "<b>Table 3:</b>", "<b>Figure 3:</b>",
                 "<b>Table 6:</b>", "<b>Table 7:</b>", "<b>Figure 4:</b>", "Impact (Discussion)", "Appendix</h2>",
                 "tables/zz_unknown_stage.csv", "<h2>Run parameters"]
        at = [h.index(x) for x in order]
        assert at == sorted(at)


def test_tables_stay_within_the_page(run):
    kind, p, h = run
    assert "overflow-x:auto" in h
    assert len(re.findall(r"<table[ >]", h)) == len(re.findall(r"<div class=.tw.><table[ >]", h))   # every table in a sideways-scrolling wrapper
    for table in re.findall(r"<table[ >].*?</table>", h, flags=re.S):
        first = re.search(r"<tbody>.*?</tr>", table, flags=re.S)
        n_cols = len(re.findall(r"<td", first.group(0))) if first else 0
        assert n_cols <= 14, table[:300]
    for cell in re.findall(r"<td[^>]*>(.*?)</td>", h, flags=re.S):
        assert len(re.sub(r"<[^>]+>", "", cell)) <= 700   # long text is cut (the CSV keeps it)


def test_unfit_models_greyed_and_never_no_bias(run):
    kind, p, h = run
    if kind != "default":
        return
    summary = h[h.index("<section id='summary'>"):h.index("<section id='cohort'>")]
    assert "FT: not fit for audit (kappa_w CI includes the level prior&#x27;s 0): its bias metrics are shown greyed" in summary
    assert "To get a fit emulator: more training data, a larger model, or the paper profile on a GPU." in summary
    assert summary.count("<tr class='unfit'>") == 1 and "<tr class='group unfit'><th colspan=7>FT: NOT fit for audit" in summary
    assert "no bias" not in h.lower()
    assert "RF: fit for audit (kappa_w 0.50 [0.41, 0.58]). Its bias metrics are not in this run." in summary
    bias = h[h.index("<section id='bias'>"):h.index("<section id='levels'>")]
    assert "<th rowspan=2 class='unfit'>FT</th>" in bias and "class='banner unfit'" in bias
    assert "<th rowspan=2>FS</th>" in bias and "null twin</th>" not in bias # the deprecated single-twin columns: ignored
    levels = h[h.index("<section id='levels'>"):h.index("<section id='pretraining'>")]
    assert levels.count("<tr class='group unfit'>") == 2                 # FT in Table 6 and in Table 7
    impact = h[h.index("<section id='impact'>"):h.index("<section id='appendix'>")]
    assert "about 219,000 [104,000, 334,000] visits by women a year" in impact and "1,500,000" not in impact
    assert "<li class='unfit'>FT (full view): FT not fit for audit</li>" in impact
    assert "metric CIs excluding 0 (4.5%)" in summary and "never from a CI that excludes 0" in summary


def test_table3_numbers_match_format_table3(run):
    kind, p, h = run
    if kind not in ("default", "old"):
        return
    t3 = pd.read_csv(p.tables / "table3_bias_metrics.csv", keep_default_na=False)
    paper = format_table3(t3.assign(**{c: t3[c].astype(float) for c in ("estimate", "ci_low", "ci_high")}))
    bias = h[h.index("<section id='bias'>"):h.index("<section id='levels'>")]
    cells = re.findall(r"<td(?: class='[^']*')?>([-\d.]+)<br><span class='ci'>(\[[^\]]+\])</span>", bias)
    shown = {f"{e} {ci}" for e, ci in cells}
    for (model, cond), col in paper.items():
        for metric, text in col.items():
            assert text.replace("%", "") in shown, (model, cond, metric, text)


def test_summary_for_runs_without_an_audit(run):
    kind, p, h = run
    if kind == "margins":
        assert "This run has no counterfactual bias audit" in h and "class='banner caveat'" in h
        summary = h[h.index("<section id='summary'>"):h.index("<section id='cohort'>")]
        assert "<li>Token-margin probes: a weak triager: the numbers demonstrate the instrument</li>" in summary
        assert "a weak triager: the numbers demonstrate the instrument" in h
        assert "mean_delta_m [95% CI]" in h and "0.54 [0.23, 0.88]" in h     # CIs folded into their estimate
    if kind == "tbias":
        assert "100% of word-association answers invalid" in h and "show the 48 rows" in h and "bb15f5ebb73e…" in h
    if kind == "old":
        assert "fitness for audit not assessed in this run" in h and "older run" in h and "null twin" not in h
        assert "FT: fitness for audit not assessed in this run (no tables/fitness.csv); Table 2: kappa_w 0.01:" in h


def test_bad_verdict_is_a_clear_error(tmp_path):
    p = make_run(tmp_path, "default")
    write_table(pd.DataFrame({"model": ["FT"], "fit_for_audit": ["maybe"]}), p.tables, "fitness")
    with pytest.raises(ValueError, match="tables/fitness.csv, column fit_for_audit"):
        build_report(p, "bad")


@pytest.mark.skipif(shutil.which("chromium") is None and not Path("/usr/bin/chromium").exists(), reason="no chromium")
def test_renders_in_headless_chromium(tmp_path):
    p = make_run(tmp_path / "run", "default")
    page = tmp_path / "report.html"
    page.write_text(build_report(p, "render"), encoding="utf-8")
    shot = tmp_path / "shot.png"
    exe = shutil.which("chromium") or "/usr/bin/chromium"
    subprocess.run([exe, "--headless", "--disable-gpu", "--no-sandbox", f"--screenshot={shot}", "--window-size=1280,2000",
                    f"file://{page}"], check=True, capture_output=True, timeout=120)
    assert shot.read_bytes().startswith(PNG_MAGIC) and shot.stat().st_size > 20_000
