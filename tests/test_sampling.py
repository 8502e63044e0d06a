"""Every profile's emulator subsample (`ft_train_n`, `ft_eval_n`) works on both real open datasets, whose rare triage
levels (a single record of a level) made the stratified split fail before (emulator.stratified_subsample)."""
from pathlib import Path

import pytest
import yaml

from triage_cf.chain import reproduce
from triage_cf.core import load_params, read_parquet, repo_root
from triage_cf.data import dataset_status
from triage_cf.audit.emulator import stratified_subsample

PROFILES = sorted(yaml.safe_load((repo_root() / "params" / "profiles.yaml").read_text()))


@pytest.mark.parametrize("dataset", ["mimic-iv-ed-demo", "ktas-2019"])
def test_every_profile_subsamples_the_real_dataset(dataset, tmp_path):
    st = dataset_status().set_index("name")
    if not st.loc[dataset, "present"]:
        pytest.skip(f"{dataset} is not under the data root ($TRIAGE_CF_DATA)")
    reproduce(dataset, "smoke", out=tmp_path / "run", until="05_emulator", quiet=True)
    root = tmp_path / "run"
    cohort = read_parquet(root / "data" / "cohort.parquet")
    split = read_parquet(root / "data" / "split.parquet")
    ids = split.groupby("split")["record_id"].apply(set)
    for profile in PROFILES:
        p = load_params(dataset, profile)
        for part, key in (("train", "ft_train_n"), ("test", "ft_eval_n")):
            df = cohort[cohort["record_id"].isin(ids[part])].sort_values("record_id").reset_index(drop=True)
            n = p.get(key)
            sub, how = stratified_subsample(df, n, seed=p.get("seed", 42))
            assert len(sub) == (len(df) if n is None else min(n, len(df))), (profile, part, how)
            assert sub["record_id"].is_unique and set(sub["record_id"]) <= set(df["record_id"])
            if n is not None and n < len(df) and "plain" not in how:
                # every level of the split is represented, the rare ones whole
                assert set(sub["triage_level"]) == set(df["triage_level"]), (profile, part, how)
