"""The one toy-record builder of the test suite: records in the canonical schema of notebook `01_data` whose triage
level is written in the chief complaint, the history and the note, so that any model must learn the mapping."""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd

#: The words that name each level (one phrase per ESI level; pass `words=` for other scales).
WORDS: dict[int, str] = {1: "cardiac arrest", 2: "crushing chest pain", 3: "abdominal pain vomiting",
                         4: "ankle sprain after fall", 5: "prescription refill"}


def toy_records(n: int, seed: int = 0, levels: Sequence[int] = (1, 2, 3, 4, 5),
                words: Mapping[int, str] = WORDS) -> pd.DataFrame:
    """`n` canonical records (every column of `triage_cf.data.CANONICAL_COLUMNS`, typed as there, plus `x_race`) with
    level `y` drawn from `levels`: `cc_text` = words[y], `hpi` = "words[y], words[y].", `note` = "patient seen at
    triage, words[y]"; the other fields are random and carry no signal. Same `seed`, same table."""
    rng = np.random.default_rng(seed)
    y = rng.choice(np.asarray(levels), n)
    age = rng.integers(18, 90, n).astype(float)
    sex = rng.choice(["F", "M"], n)
    w = [words[int(v)] for v in y]
    df = pd.DataFrame({
        "record_id": pd.array([f"r{seed}_{i}" for i in range(n)], dtype="string"),
        "patient_id": pd.array([f"p{seed}_{i}" for i in range(n)], dtype="string"),
        "arrival_time": pd.Timestamp("2021-03-01 08:00") + pd.to_timedelta(rng.integers(0, 10_000, n), unit="min"),
        "age": age, "sex": pd.array(sex, dtype="string"),
        "hr": rng.normal(85, 12, n).round(), "rr": np.nan, "sbp": rng.normal(130, 15, n).round(), "dbp": np.nan,
        "spo2": np.nan, "temp_c": rng.normal(37, 0.5, n).round(1), "gcs": np.nan, "pain": np.nan,
        "cc_code": pd.array([None] * n, dtype="string"), "cc_text": pd.array(w, dtype="string"),
        "hpi": pd.array([f"{t}, {t}." for t in w], dtype="string"), "pmh": pd.array([None] * n, dtype="string"),
        "note": pd.array([f"patient seen at triage, {t}" for t in w], dtype="string"),
        "nurse_sex": pd.array(rng.choice(["F", "M"], n), dtype="string"), "nurse_experience_years": np.nan,
        "nurse_triage_training": pd.array([None] * n, dtype="boolean"), "ed_load": np.nan,
        "arrival_mode": pd.array([None] * n, dtype="string"), "triage_level": pd.array(y, dtype="Int64"),
        "x_race": "unknown"})
    df["arrival_time"] = df["arrival_time"].astype("datetime64[ns]")
    for c in ("rr", "dbp", "spo2", "gcs", "pain", "nurse_experience_years", "ed_load"):
        df[c] = df[c].astype("float64")
    return df
