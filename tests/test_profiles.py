"""Every profile of params/profiles.yaml is consistent with the stages it runs, for every dataset."""
import pytest

from triage_cf.chain import STAGES, notebook_defaults, stages_for
from triage_cf.core import _read_yaml, load_params, repo_root

PROFILES = sorted(_read_yaml(repo_root() / "params" / "profiles.yaml"))
DATASETS = sorted(p.stem for p in (repo_root() / "params").glob("*.yaml") if p.stem != "profiles")


@pytest.mark.parametrize("profile", PROFILES)
def test_null_twins_only_where_stage_04_null_control_runs(profile):
    """The stages that train or score null twins (04, 04b, 06) read stage 04_null_control's permuted records; their notebooks'
    default `null_control` is the smoke profile's True, so a profile running them must say whether 03e runs."""
    for dataset in DATASETS:
        params = load_params(dataset, profile)
        stages = stages_for(params)
        if {"05_emulator", "06_baselines", "08_predict"} & set(stages):
            assert "null_control" in params, f"{profile}/{dataset}: runs the emulator stages but leaves null_control unset"
            assert bool(params["null_control"]) == ("04_null_control" in stages), (profile, dataset)


@pytest.mark.parametrize("profile", PROFILES)
def test_subsamples_nest(profile):
    "The MLP's pair subsample holds the FT one (07_counterfactuals refuses the opposite)."
    for dataset in DATASETS:
        params = load_params(dataset, profile)
        ft, mlp = params.get("ft_max_pairs"), params.get("mlp_max_pairs")
        if mlp is not None:
            assert ft is not None and ft <= mlp, (profile, dataset, ft, mlp)


def test_notebook_defaults_agree():
    """Where a profile leaves a parameter unset, the stage notebooks it runs that declare it agree on its default, so
    that `triage-cf plan` (which reads them) and the stages mean one thing."""
    every = notebook_defaults(list(STAGES))
    for profile in PROFILES:
        for dataset in DATASETS:
            params = load_params(dataset, profile)
            stages = set(stages_for(params))
            for name, by_stage in every.items():
                if name in params or name == "run_dir":   # set by the profile, or by the chain for every stage
                    continue
                values = {repr(v) for s, v in by_stage.items() if s in stages}
                assert len(values) <= 1, (profile, dataset, name, {s: v for s, v in by_stage.items() if s in stages})


@pytest.mark.parametrize("dataset", DATASETS)
def test_paper_profile_runs_whole_splits(dataset):
    """The paper profile trains and scores at the paper's sizes: no cap on training records, test records or pairs is
    left to a notebook's own (smoke-size) default. The bug it guards: `ft_train_n` unset trained the emulator on 120 visits."""
    params = load_params(dataset, "paper")
    defaults = notebook_defaults(stages_for(params))
    for cap in ("ft_train_n", "ft_eval_n", "ft_max_pairs", "mlp_max_pairs", "baseline_train_n", "fs_train_n"):
        assert cap in params or cap in defaults, (dataset, cap)
        value = params[cap] if cap in params else next(iter(defaults[cap].values()))
        assert value is None, f"paper/{dataset}: {cap} = {value!r} ({'profile' if cap in params else 'notebook default'})"
