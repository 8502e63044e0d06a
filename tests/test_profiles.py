"""Every profile of params/profiles.yaml is consistent with the stages it runs, for every dataset."""
import pytest

from triage_cf.chain import stages_for
from triage_cf.core import _read_yaml, load_params, repo_root

PROFILES = sorted(_read_yaml(repo_root() / "params" / "profiles.yaml"))
DATASETS = sorted(p.stem for p in (repo_root() / "params").glob("*.yaml") if p.stem != "profiles")


@pytest.mark.parametrize("profile", PROFILES)
def test_null_twins_only_where_stage_03e_runs(profile):
    """The stages that train or score null twins (04, 04b, 06) read stage 03e's permuted records; their notebooks'
    default `null_control` is the smoke profile's True, so a profile running them must say whether 03e runs."""
    for dataset in DATASETS:
        params = load_params(dataset, profile)
        stages = stages_for(params)
        if {"04_emulator", "04b_baselines", "06_predict"} & set(stages):
            assert "null_control" in params, f"{profile}/{dataset}: runs the emulator stages but leaves null_control unset"
            assert bool(params["null_control"]) == ("03e_null_control" in stages), (profile, dataset)


@pytest.mark.parametrize("profile", PROFILES)
def test_subsamples_nest(profile):
    "The MLP's pair subsample holds the FT one (05_counterfactuals refuses the opposite)."
    for dataset in DATASETS:
        params = load_params(dataset, profile)
        ft, mlp = params.get("ft_max_pairs"), params.get("mlp_max_pairs")
        if mlp is not None:
            assert ft is not None and ft <= mlp, (profile, dataset, ft, mlp)
