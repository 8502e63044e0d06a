"""Loaders of the credentialed / restricted datasets on small fake copies (real column names, written here into tmp
folders), and the broken-input corpus: each broken file gives a clear error or a counted exclusion."""
import gzip

import pandas as pd
import pytest

from triage_cf.cohort import apply_cohort
from triage_cf.core import sha256_file
from triage_cf.data import load_manifest, load_records, verify_files

# ---------------------------------------------------------------- fake CHU Bordeaux (contract schema, passages.csv)

BORDEAUX_COLS = ["id_passage", "date_entree", "saturation_su", "age", "sexe", "motif_code", "motif_libelle",
                 "histoire_maladie", "antecedents", "fc", "fr", "pas", "pad", "spo2", "temperature", "glasgow", "eva",
                 "ide_sexe", "ide_experience_annees", "ide_formation_tri", "cimu"]


def _bdx_row(i, **kw):
    row = dict(id_passage=f"P{i:04d}", date_entree="2018-03-0%d 10:1%d" % (1 + i % 9, i % 10), saturation_su="1.2",
               age=str(30 + i), sexe="F" if i % 2 else "H", motif_code="R07", motif_libelle="Douleur thoracique",
               histoire_maladie="Douleur depuis 2 h, irradiant au bras", antecedents="HTA", fc="80", fr="16", pas="130",
               pad="80", spo2="98", temperature="37,1", glasgow="15", eva="4", ide_sexe="F", ide_experience_annees="6",
               ide_formation_tri="1", cimu=str(2 + i % 3))
    row.update(kw)
    return row


def _bordeaux(tmp_path, rows, raw_text=None, sep=";", encoding="utf-8"):
    """Write a fake chu-bordeaux/passages.csv and return (manifest with its sha256 pinned, data root)."""
    m = load_manifest("chu-bordeaux")
    p = tmp_path / m["files"][0]["path"]
    p.parent.mkdir(parents=True, exist_ok=True)
    if raw_text is not None:
        p.write_bytes(raw_text if isinstance(raw_text, bytes) else raw_text.encode(encoding))
    else:
        pd.DataFrame(rows, columns=BORDEAUX_COLS).to_csv(p, sep=sep, index=False, encoding=encoding)
    m["files"][0]["sha256"] = sha256_file(p)
    return m, tmp_path


def _dq(dq):
    return {(r.column, r.issue): r.count for r in dq.itertuples()}


def test_fake_bordeaux_loads_and_filters(tmp_path):
    rows = [_bdx_row(i) for i in range(12)]
    rows[0]["date_entree"] = "2015-12-31 23:59"                                   # before 2016: date window
    rows[1]["ide_sexe"] = ""                                                      # nurse sex missing
    rows[2]["age"] = "16"                                                         # minor
    rows[3]["motif_libelle"] = "Saignement génital féminin"                        # sex-specific class
    rows[4]["antecedents"] = "Hystérectomie en 2010"                              # Table 4 term in PMH
    rows[5]["histoire_maladie"] = "Patiente ENCEINTE de 12 SA, douleur"            # Table 4 term in HPI, upper case
    rows[6]["cimu"] = "1"                                                         # level 1 excluded
    rows[7]["glasgow"] = ""                                                       # vital missing
    m, root = _bordeaux(tmp_path, rows)
    rec, dq = load_records(m, root=root)
    assert len(rec) == 12 and rec["sex"].tolist()[:2] == ["M", "F"]
    assert rec["temp_c"].iloc[0] == pytest.approx(37.1) and rec["nurse_triage_training"].iloc[0]
    assert rec["arrival_time"].iloc[0] == pd.Timestamp("2015-12-31 23:59")
    assert rec["hpi"].notna().all() and rec["cc_code"].eq("R07").all()
    res = apply_cohort(rec, m["cohort"], rows_read=_dq(dq)[("(table)", "rows_read")])
    removed = res.exclusions.set_index("record_id")["rule"].to_dict()
    assert removed == {"P0000": "date_window", "P0001": "missing_nurse_sex", "P0002": "min_age",
                       "P0003": "sex_specific_cc", "P0004": "sex_specific_terms", "P0005": "sex_specific_terms",
                       "P0006": "excluded_levels", "P0007": "missing_gcs"}
    assert len(res.cohort) == 4 and res.flow["n_removed"].sum() == 8


# ---------------------------------------------------------------- fake full MIMIC-IV-ED 2.2 + hosp + Note

DISCHARGE = """ \nName:  ___                     Unit No:   ___\n \nAdmission Date:  ___              Discharge Date:   ___\n \n\
Date of Birth:  ___             Sex:   {sex}\n \nService: MEDICINE\n \nAllergies: \nNo Known Allergies / Adverse Drug Reactions\n \n\
Attending: ___.\n \nChief Complaint:\n{cc}\n \nMajor Surgical or Invasive Procedure:\nParacentesis\n \n\
History of Present Illness:\n{hpi}\n \nPast Medical History:\n{pmh}\n \nSocial History:\n___\nFamily History:\nNon-contributory\n \n\
Physical Exam:\nADMISSION PHYSICAL EXAM: abdomen distended\n \nPertinent Results:\n___ 07:00AM WBC-12.1\n \n\
Brief Hospital Course:\nTreated with antibiotics, improved.\n \nDischarge Diagnosis:\nSBP\n \nDischarge Instructions:\nReturn if fever.\n"""


def _gz_csv(path, df):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8", newline="") as f:
        df.to_csv(f, index=False)


def _mimic_full(tmp_path):
    m = load_manifest("mimic-iv-ed")
    paths = {f["key"]: tmp_path / f["path"] for f in m["files"]}
    stays = pd.DataFrame({
        "subject_id": [1, 1, 2, 3, 4, 5], "hadm_id": [11, "", 21, 31, 41, 51], "stay_id": [101, 102, 201, 301, 401, 501],
        "intime": ["2150-01-01 10:00:00", "2151-02-02 11:00:00", "2160-05-05 05:05:00", "2170-07-07 07:07:00",
                   "2180-08-08 08:08:00", "2190-09-09 09:09:00"],
        "outtime": ["2150-01-01 16:00:00"] * 6, "gender": ["F", "F", "M", "F", "M", "X"],
        "race": ["WHITE", "WHITE", "BLACK", "ASIAN", "OTHER", "WHITE"],
        "arrival_transport": ["AMBULANCE", "WALK IN", "WALK IN", "HELICOPTER", "UNKNOWN", "WALK IN"],
        "disposition": ["ADMITTED", "HOME", "ADMITTED", "ADMITTED", "ADMITTED", "ADMITTED"]})
    triage = pd.DataFrame({
        "subject_id": [1, 1, 2, 3, 4, 5], "stay_id": [101, 102, 201, 301, 401, 501],
        "temperature": [98.6, 36.5, 99.1, 100.2, 97.0, 98.0], "heartrate": [88, 90, 100, 110, 70, 80],
        "resprate": [16, 18, 20, 22, 16, 14], "o2sat": [98, 97, 99, 95, 100, 99], "sbp": [120, 879, 140, 100, 130, 125],
        "dbp": [80, 70, 879, 60, 85, 75], "pain": ["3", "UA", "10", "Critical", "0", "5"],
        "acuity": [2, 3, 3, 5, 2, 3], "chiefcomplaint": ["Abd pain", "Fever", "Chest pain", "Dyspnea", "Syncope", "Headache"]})
    patients = pd.DataFrame({"subject_id": [1, 2, 3, 4], "gender": ["F", "M", "F", "M"], "anchor_age": [40, 65, 30, 80],
                             "anchor_year": [2150, 2160, 2170, 2178], "anchor_year_group": ["2011 - 2013"] * 4, "dod": [""] * 4})
    notes = pd.DataFrame({
        "note_id": ["1-DS-1", "2-DS-1", "2-DS-2", "3-DS-1", "4-DS-1"], "subject_id": [1, 2, 2, 3, 4],
        "hadm_id": [11, 21, 21, 31, 41], "note_type": ["DS"] * 5, "note_seq": [1, 1, 2, 1, 1],
        "charttime": ["2150-01-05 00:00:00"] * 5, "storetime": ["2150-01-05 12:00:00"] * 5,
        "text": [DISCHARGE.format(sex="F", cc="Abdominal pain", hpi="40F with cirrhosis, abdominal pain x2d.", pmh="HCV cirrhosis"),
                 DISCHARGE.format(sex="M", cc="Chest pain", hpi="65M with chest pain at rest.", pmh="CAD, HTN"),
                 DISCHARGE.format(sex="M", cc="Second note", hpi="a later addendum", pmh="none"),
                 DISCHARGE.format(sex="F", cc="Dyspnea", hpi="30F, pregnant, with dyspnea.", pmh="asthma"),
                 DISCHARGE.format(sex="M", cc="Syncope", hpi="80M fainted; h/o prostate cancer.", pmh="BPH")]})
    for key, df in {"edstays": stays, "triage": triage, "patients": patients, "discharge": notes}.items():
        _gz_csv(paths[key], df)
        next(f for f in m["files"] if f["key"] == key)["sha256"] = sha256_file(paths[key])
    return m, tmp_path


def test_fake_mimic_ed_full(tmp_path):
    m, root = _mimic_full(tmp_path)
    rec, dq = load_records(m, root=root)
    q = _dq(dq)
    r = rec.set_index("record_id")
    assert list(r.index) == ["101", "102", "201", "301", "401", "501"]
    assert r.loc["101", "age"] == 40 and r.loc["201", "age"] == 65 and r.loc["401", "age"] == 82   # anchor rule
    assert pd.isna(r.loc["501", "age"]) and q[("age", "unlinked")] == 1                              # no patient row
    # the note holds only what is known at triage (section 5.1.2): no header (sex), exam, results, course, discharge
    note = r.loc["101", "note"]
    assert "cirrhosis, abdominal pain" in note and "Chief Complaint: Abdominal pain" in note and "No Known Allergies" in note
    for cut in ("Sex:", "Unit No", "Paracentesis", "distended", "WBC", "antibiotics", "Return if fever", "Discharge"):
        assert cut not in note, cut
    assert r.loc["101", "hpi"] == "40F with cirrhosis, abdominal pain x2d." and r.loc["201", "pmh"] == "CAD, HTN"
    assert "later addendum" not in r.loc["201", "note"] and q[("note", "multiple_notes")] == 1        # first note_seq
    assert pd.isna(r.loc["102", "note"])                                                              # no admission
    # messy values, counted
    assert q[("sbp", "implausible")] == 1 and q[("dbp", "implausible")] == 1 and q[("temp_c", "implausible")] == 1
    assert q[("pain", "unparseable")] == 2 and q[("sex", "unknown_code")] == 1
    assert r.loc["101", "temp_c"] == pytest.approx(37.0) and r.loc["301", "arrival_mode"] == "helicopter"
    # cohort (paper section 5.1.2 order): linkage, required, adults, ESI 5, Table 5 terms in cc and note
    res = apply_cohort(rec, m["cohort"], rows_read=q[("(table)", "rows_read")])
    removed = res.exclusions.set_index("record_id")["rule"].to_dict()
    assert removed == {"102": "linkage", "501": "linkage", "301": "excluded_levels", "401": "sex_specific_terms"}
    assert res.cohort["record_id"].tolist() == ["101", "201"]


# ---------------------------------------------------------------- the broken-input corpus

def test_broken_wrong_delimiter(tmp_path):
    m, root = _bordeaux(tmp_path, [_bdx_row(i) for i in range(3)], sep=",")
    with pytest.raises(ValueError, match=r"passages\.csv: wrong delimiter: the manifest declares ';' but the header is ','-delimited"):
        load_records(m, root=root)


def test_broken_missing_column(tmp_path):
    rows = pd.DataFrame([_bdx_row(i) for i in range(3)]).drop(columns=["glasgow"])
    m, root = _bordeaux(tmp_path, None, raw_text=rows.to_csv(sep=";", index=False))
    with pytest.raises(ValueError, match=r"passages\.csv: missing required column\(s\) \['glasgow'\] \(1 of 21 required\)"):
        load_records(m, root=root)


def test_broken_non_numeric_vitals_counted(tmp_path):
    rows = [_bdx_row(i) for i in range(5)]
    rows[0]["fc"], rows[1]["fc"], rows[2]["pas"], rows[3]["spo2"] = "quatre-vingt", "tachy", "NA?", "101"
    m, root = _bordeaux(tmp_path, rows)
    rec, dq = load_records(m, root=root)
    q = _dq(dq)
    assert q[("hr", "unparseable")] == 2 and q[("sbp", "unparseable")] == 1 and q[("spo2", "implausible")] == 1
    assert rec["hr"].isna().sum() == 2 and len(rec) == 5
    # then the cohort removes them by name (vitals are required for Bordeaux)
    res = apply_cohort(rec, m["cohort"], rows_read=5)
    assert res.flow.set_index("rule").loc[["missing_hr", "missing_sbp", "missing_spo2"], "n_removed"].tolist() == [2, 1, 1]


def test_broken_unknown_sex_code_counted_and_excluded(tmp_path):
    rows = [_bdx_row(i) for i in range(4)]
    rows[1]["sexe"], rows[2]["sexe"] = "X", "homme"
    m, root = _bordeaux(tmp_path, rows)
    rec, dq = load_records(m, root=root)
    assert _dq(dq)[("sex", "unknown_code")] == 2 and rec["sex"].isna().sum() == 2 and len(rec) == 4
    res = apply_cohort(rec, m["cohort"], rows_read=4)
    assert set(res.exclusions.loc[res.exclusions["rule"] == "missing_sex", "record_id"]) == {"P0001", "P0002"}


def test_broken_out_of_scale_level_counted_and_excluded(tmp_path):
    rows = [_bdx_row(i) for i in range(4)]
    rows[0]["cimu"], rows[1]["cimu"], rows[2]["cimu"] = "6", "0", "2.5"
    m, root = _bordeaux(tmp_path, rows)
    rec, dq = load_records(m, root=root)
    assert _dq(dq)[("triage_level", "out_of_scale")] == 3 and rec["triage_level"].isna().sum() == 3
    res = apply_cohort(rec, m["cohort"], rows_read=4)
    assert res.flow.set_index("rule").loc["missing_triage_level", "n_removed"] == 3


def test_broken_duplicated_ids_counted_and_accounted(tmp_path):
    rows = [_bdx_row(i) for i in range(5)]
    rows.append(dict(rows[0]))                                   # identical copy: one kept
    rows.append({**rows[1], "fc": "120"})                        # conflicting copy: both removed
    m, root = _bordeaux(tmp_path, rows)
    rec, dq = load_records(m, root=root)
    q = _dq(dq)
    assert q[("record_id", "duplicate_identical_removed")] == 1 and q[("record_id", "duplicate_conflicting_removed")] == 2
    assert q[("(table)", "rows_read")] == 7 and len(rec) == 4 and rec["record_id"].is_unique
    assert "P0001" not in set(rec["record_id"])
    res = apply_cohort(rec, m["cohort"], rows_read=q[("(table)", "rows_read")])
    assert res.flow.iloc[0][["rule", "n_in", "n_removed", "n_out"]].tolist() == ["01_data", 7, 3, 4]
    assert 7 - res.flow["n_removed"].sum() == len(res.cohort)


def test_broken_non_utf8_bytes(tmp_path):
    text = ";".join(BORDEAUX_COLS) + "\n" + ";".join(_bdx_row(0).values()) + "\n"
    bad = text.encode("utf-8") + ";".join(_bdx_row(1, antecedents="Diabète").values()).encode("latin-1") + b"\n"
    m, root = _bordeaux(tmp_path, None, raw_text=bad)
    with pytest.raises(ValueError, match=r"passages\.csv: not valid utf-8: byte 0xe8 at line 3"):
        load_records(m, root=root)
    m["files"][0]["encoding"] = "latin-1"             # declared in the manifest, the same bytes load
    rec, _ = load_records(m, root=root)
    assert rec["pmh"].iloc[1] == "Diabète"


def test_broken_empty_file_and_header_only(tmp_path):
    m, root = _bordeaux(tmp_path, None, raw_text=b"")
    with pytest.raises(ValueError, match=r"passages\.csv: empty file \(0 bytes\)"):
        load_records(m, root=root)
    m, root = _bordeaux(tmp_path, None, raw_text=";".join(BORDEAUX_COLS) + "\n")
    with pytest.raises(ValueError, match=r"passages\.csv: header only, 0 data rows"):
        load_records(m, root=root)


def test_broken_empty_required_text_counted_and_excluded(tmp_path):
    rows = [_bdx_row(i) for i in range(4)]
    rows[0]["histoire_maladie"], rows[1]["histoire_maladie"] = "   ", "???"
    m, root = _bordeaux(tmp_path, rows)
    rec, dq = load_records(m, root=root)
    q = _dq(dq)
    assert q[("hpi", "empty_text")] == 1 and q[("hpi", "unreadable_text")] == 1
    res = apply_cohort(rec, m["cohort"], rows_read=4)
    assert res.flow.set_index("rule").loc["missing_hpi", "n_removed"] == 2


def test_missing_or_changed_file_names_file_sha_and_url(tmp_path):
    m, root = _bordeaux(tmp_path, [_bdx_row(0)])
    sha = m["files"][0]["sha256"]
    (root / m["files"][0]["path"]).write_text("changed\n")
    with pytest.raises(ValueError, match=rf"chu-bordeaux/passages\.csv.*but the manifest expects {sha}.*restricted"):
        verify_files(m, root)
    (root / m["files"][0]["path"]).unlink()
    with pytest.raises(FileNotFoundError, match=rf"chu-bordeaux/passages\.csv.*missing; expected sha256 {sha}; get it from restricted"):
        load_records(m, root=root)
    m2 = load_manifest("chu-bordeaux")                # shipped manifest: nothing pinned for restricted data
    (root / m2["files"][0]["path"]).write_text("x\n")
    with pytest.raises(ValueError, match="no sha256 pinned"):
        verify_files(m2, root)


# ---------------------------------------------------------------- the synthetic path (generator stubbed here)

def test_synth_loader_calls_generator_and_maps_like_real_data(monkeypatch):
    """load_records on a synthetic manifest calls triage_cf.synth.generate_raw(lang, seed, **knobs) and sends its
    raw table (contract's synth-en schema) through the same mapping, counting and validation as real data."""
    calls = []

    def generate_raw(lang, seed, n=4, **kw):
        calls.append((lang, seed, n, kw))
        return pd.DataFrame({
            "stay_id": [1, 2, 3, 4][:n], "subject_id": [10, 20, 30, 40][:n],
            "intime": ["2150-01-01 10:00:00", "2150-01-02 10:00:00", "bad", "2150-01-04 10:00:00"][:n],
            "gender": ["F", "M", "M", "Q"][:n], "age": [34.0, 71.0, 15.0, 50.0][:n],
            "arrival_transport": ["WALK IN", "AMBULANCE", "WALK IN", "OTHER"][:n],
            "temperature": [98.6, 101.0, 36.6, 99.0][:n], "heartrate": [80, 120, 90, 70][:n],
            "resprate": [16, 24, 18, 14][:n], "o2sat": [99, 91, 98, 97][:n], "sbp": [120, 95, 130, 140][:n],
            "dbp": [80, 60, 85, 90][:n], "pain": [3, 8, 11, 0][:n], "acuity": [3, 2, 4, 9][:n],
            "chiefcomplaint": ["headache", "chest pain", "ankle pain", "fever"][:n],
            "triage_note": ["mild headache since morning", "crushing chest pain", "", "fever 2 days"][:n]})

    from triage_cf import synth
    monkeypatch.setattr(synth, "generate_raw", generate_raw)   # triage_cf.data calls synth.generate_raw
    m = {"name": "synth-test", "title": "synthetic test", "citation": "-", "licence": "-", "access": "open", "language": "en",
         "triage_scale": {"name": "ESI", "levels": [1, 2, 3, 4, 5], "most_severe": 1}, "loader": "synth",
         "generator": {"lang": "en"}, "files": [],
         "columns": {"record_id": "stay_id", "patient_id": "subject_id", "arrival_time": "intime", "age": "age",
                     "sex": "gender", "hr": "heartrate", "rr": "resprate", "sbp": "sbp", "dbp": "dbp", "spo2": "o2sat",
                     "temp_c": "temperature", "pain": "pain", "cc_text": "chiefcomplaint", "note": "triage_note",
                     "arrival_mode": "arrival_transport", "triage_level": "acuity"},
         "units": {"temp_c": "fahrenheit"}, "codes": {"sex": {"F": "F", "M": "M"}},
         "text_fields": ["cc_text", "note"], "cohort": [{"rule": "required", "fields": ["sex", "triage_level"]}]}
    rec, dq = load_records(m, seed=7, synth={"n": 4, "knob": 1})
    assert calls == [("en", 7, 4, {"knob": 1})]
    q = _dq(dq)
    assert rec["record_id"].tolist() == ["1", "2", "3", "4"] and rec["temp_c"].iloc[0] == pytest.approx(37.0)
    assert q[("sex", "unknown_code")] == 1 and q[("triage_level", "out_of_scale")] == 1 and q[("pain", "implausible")] == 1
    assert q[("temp_c", "implausible")] == 1 and q[("arrival_time", "unparseable")] == 1 and q[("note", "empty_text")] == 1
    res = apply_cohort(rec, m["cohort"], rows_read=4)
    assert res.exclusions.set_index("record_id")["rule"].to_dict() == {"4": "missing_sex"}
    # a generator whose table lacks a mapped column: an error naming the generator and the column
    monkeypatch.setattr(synth, "generate_raw",
                        lambda lang, seed, **kw: generate_raw(lang, seed, **kw).drop(columns=["triage_note"]))
    with pytest.raises(ValueError, match=r"generate_raw\(lang='en'\): missing required column\(s\) \['triage_note'\]"):
        load_records(m, synth={})
