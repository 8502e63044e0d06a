"""The open real datasets under $TRIAGE_CF_DATA (CI: ../shared/data): loading, data quality, cohort flow, split,
and the `triage-cf datasets` status. Each test skips, saying why, only where the files are absent."""
import pandas as pd
import pytest

from triage_cf.cohort import apply_cohort
from triage_cf.core import data_root
from triage_cf.data import dataset_status, file_checksum_status, list_manifests, load_manifest, load_records
from triage_cf.audit.split import check_split, split_balance, stratified_split


def _need(name):
    m = load_manifest(name)
    absent = [f["path"] for f in m["files"] if file_checksum_status(f) == "missing"]
    if absent:
        pytest.skip(f"{name}: files absent under the data root {data_root()} ({absent}); set TRIAGE_CF_DATA")
    return m


def _dq(dq):
    return {(r.column, r.issue): r.count for r in dq.itertuples()}


@pytest.fixture(scope="module")
def mimic_demo():
    m = _need("mimic-iv-ed-demo")
    rec, dq = load_records(m)
    return m, rec, dq


@pytest.fixture(scope="module")
def ktas():
    m = _need("ktas-2019")
    rec, dq = load_records(m)
    return m, rec, dq


def test_mimic_demo_records_and_messy_values(mimic_demo):
    m, rec, dq = mimic_demo
    q = _dq(dq)
    assert len(rec) == 222 and q[("(table)", "rows_read")] == 222 and rec["record_id"].is_unique
    # the README's messy values: pain "UA"/"unable"/"Critical" (and "o", "uta", "ett"), pain 13 on a 0-10 scale,
    # one Celsius temperature among Fahrenheit ones, a dbp of 879
    assert q[("pain", "unparseable")] == 12 and q[("pain", "implausible")] == 7
    assert q[("temp_c", "implausible")] == 1 and q[("dbp", "implausible")] == 1
    assert q[("triage_level", "missing")] == 15
    assert rec["pain"].dropna().between(0, 10).all() and rec["temp_c"].dropna().between(30, 43).all()
    assert rec["dbp"].max() < 879 and set(rec["sex"]) == {"F", "M"}
    assert rec["age"].notna().all() and rec["age"].min() >= 18                      # anchor_age + year - anchor_year
    assert set(dq.columns) == {"column", "issue", "count"}


def test_mimic_demo_cohort_and_split(mimic_demo):
    m, rec, dq = mimic_demo
    res = apply_cohort(rec, m["cohort"], rows_read=_dq(dq)[("(table)", "rows_read")])
    f = res.flow.set_index("rule")
    assert res.flow["n_in"].iloc[0] == 222 and f.loc["missing_triage_level", "n_removed"] == 15
    assert 222 - res.flow["n_removed"].sum() == len(res.cohort) == 207
    assert len(res.exclusions) == 15 and set(res.exclusions["rule"]) == {"missing_triage_level"}
    assert set(res.cohort["triage_level"]) <= {1, 2, 3, 4}
    split = stratified_split(res.cohort, 0.5, seed=42)
    bal = split_balance(res.cohort, split)
    check_split(res.cohort, split, bal)
    assert bal["abs_diff"].max() < 0.01


def test_ktas_records_codes_and_quality(ktas):
    m, rec, dq = ktas
    q = _dq(dq)
    assert len(rec) == 1267 and rec["record_id"].tolist()[:3] == ["1", "2", "3"]
    # genero 1 = female, 2 = male, checked against the English copy of the same rows
    en = pd.read_csv(data_root() / "ktas-moon-2019" / "emergency_service_triage_en_binary.csv")
    assert (rec["sex"].map({"F": "Female", "M": "Male"}).to_numpy() == en["Sex"].to_numpy()).all()
    assert (rec["age"].to_numpy() == en["Age"].to_numpy()).all()
    assert rec["triage_level"].value_counts().sort_index().tolist() == [18, 214, 447, 501, 87]
    assert rec["x_ktas_expert"].notna().all() and rec["arrival_mode"].notna().all()
    # chief complaints whose Korean characters were lost ('?') or empty are counted, not silently kept
    assert q[("cc_text", "empty_text")] + q[("cc_text", "unreadable_text")] == 21
    assert q[("spo2", "implausible")] == 1


def test_ktas_cohort(ktas):
    m, rec, dq = ktas
    res = apply_cohort(rec, m["cohort"], rows_read=_dq(dq)[("(table)", "rows_read")])
    f = res.flow.set_index("rule")["n_removed"]
    assert res.flow["n_in"].iloc[0] == 1267
    assert f["missing_cc_text"] == 21 and f["min_age"] == 13 and f["excluded_levels"] == 18
    assert f["sex_specific_terms"] == 17          # vaginal bleeding / spotting / discharge, penile, scrotal pain
    assert 1267 - f.sum() == len(res.cohort) == 1198
    assert not res.cohort["cc_text"].str.contains("vagin|scrot|penil", case=False).any()
    tc = res.term_counts.set_index("term")["n_records"]
    assert tc["vagin"] == 15 and tc["scrot"] == 1 and tc["penil"] == 1


def test_ktas_complaint_categories(ktas):
    "The audit's complaint map on the real open KTAS complaints: most land in a named category, the large ones present."
    from triage_cf.cohort import complaint_categories
    m, rec, dq = ktas
    cat = complaint_categories(rec["cc_text"], m["language"], "complaint_categories_audit_v1.tsv")
    share = cat.value_counts(normalize=True)
    assert share["other"] < 0.25
    assert {"chest pain", "abdominal pain", "dyspnea", "neuro", "trauma"} <= set(share[share > 0.04].index)


def test_dataset_status():
    st = dataset_status().set_index("name")
    assert {"mimic-iv-ed-demo", "ktas-2019", "mimic-iv-ed", "chu-bordeaux"} <= set(st.index)
    assert set(st.index) == set(list_manifests())
    assert st.loc["mimic-iv-ed", "access"] == "credentialed" and st.loc["chu-bordeaux", "access"] == "restricted"
    assert st.loc["chu-bordeaux", "language"] == "fr" and st.loc["chu-bordeaux", "triage_scale"] == "CIMU"
    assert st.loc["ktas-2019", "triage_scale"] == "KTAS" and st.loc["mimic-iv-ed-demo", "access"] == "open"
    for name in ("mimic-iv-ed-demo", "ktas-2019"):
        _need(name)
        assert bool(st.loc[name, "present"]) and st.loc[name, "checksum"] == "ok"


def test_dataset_status_mismatch_and_missing(tmp_path):
    st = dataset_status(tmp_path).set_index("name")           # an empty data root
    real = st[st["checksum"] != "generated"]
    assert (~real["present"]).all() and (real["checksum"] == "missing").all()
    m = load_manifest("ktas-2019")
    p = tmp_path / m["files"][0]["path"]
    p.parent.mkdir(parents=True)
    p.write_text("not the KTAS file\n")
    st = dataset_status(tmp_path).set_index("name")
    assert bool(st.loc["ktas-2019", "present"]) and st.loc["ktas-2019", "checksum"] == "mismatch"


def test_chain_data_cohort_split_on_mimic_demo(tmp_path):
    """The three stage notebooks through the chain runner on the real demo files (what `triage-cf reproduce` runs)."""
    _need("mimic-iv-ed-demo")
    from triage_cf.chain import reproduce
    from triage_cf.core import RunPaths, read_parquet
    out = tmp_path / "run"
    res = reproduce("mimic-iv-ed-demo", "smoke", out=out, stages=["01_data", "02_cohort", "03_split"], quiet=True, progress=False)
    assert [r.status for r in res] == ["ran", "ran", "ran"]
    p = RunPaths(out)
    flow = pd.read_csv(p.tables / "cohort_flow.csv")
    assert flow["n_in"].iloc[0] == 222 and 222 - flow["n_removed"].sum() == flow["n_out"].iloc[-1]
    cohort, excl, split = (read_parquet(p.data / f) for f in ("cohort.parquet", "exclusions.parquet", "split.parquet"))
    assert len(cohort) + len(excl) == 222 and set(split["record_id"]) == set(cohort["record_id"])
    dq = pd.read_csv(p.tables / "data_quality.csv")
    assert list(dq.columns) == ["column", "issue", "count"]
    for f in ("cohort_flow.png", "figure5_distributions.png"):
        assert (p.figures / f).stat().st_size > 1000
    assert (p.tables / "split_balance.csv").exists() and (p.data / "provenance.json").exists()
