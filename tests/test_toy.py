"""The shared toy-record builder (tests/_toy.py) gives valid canonical records, deterministically."""
import pandas as pd

from triage_cf.data import validate_records

from _toy import WORDS, toy_records


def test_toy_records_are_canonical_and_deterministic():
    df = toy_records(30, seed=3, levels=[2, 3, 4, 5])
    validate_records(df, levels=[1, 2, 3, 4, 5], source="toy_records")
    pd.testing.assert_frame_equal(df, toy_records(30, seed=3, levels=[2, 3, 4, 5]))
    assert set(df["triage_level"]) <= {2, 3, 4, 5} and df["record_id"].is_unique
    assert all(WORDS[int(lv)] == cc for lv, cc in zip(df["triage_level"], df["cc_text"]))
    assert not toy_records(30, seed=4)["cc_text"].equals(df["cc_text"])
