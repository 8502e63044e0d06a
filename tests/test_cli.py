"""The installed `triage-cf` console script: metrics on a pairs CSV, errors on bad input, datasets listing."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

CLI = str(Path(sys.executable).with_name("triage-cf"))


def _run(*args):
    return subprocess.run([CLI, *args], capture_output=True, text=True)


def test_help_lists_commands():
    p = _run("--help")
    assert p.returncode == 0
    for cmd in ("reproduce", "datasets", "metrics"):
        assert cmd in p.stdout


def test_metrics_on_pairs_csv(tmp_path):
    rng = np.random.default_rng(0)
    n = 400
    y = rng.integers(2, 6, n)
    df = pd.DataFrame({"pair_id": np.arange(n), "orig_sex": rng.choice(["F", "M"], n), "pred_orig": y,
                       "pred_cf": np.clip(y + rng.choice([-1, 0, 0, 0, 1], n), 2, 5), "condition": "full", "true_level": y})
    df.to_csv(tmp_path / "pairs.csv", index=False)
    p = _run("metrics", "--pairs", str(tmp_path / "pairs.csv"), "--out", str(tmp_path / "out"), "--n-boot", "200", "--seed", "1")
    assert p.returncode == 0, p.stderr
    m = pd.read_csv(tmp_path / "out" / "metrics.csv")
    pdr = m.loc[m.metric == "PDR", "estimate"].item()
    assert pdr == pytest.approx((df.pred_orig != df.pred_cf).mean(), abs=1e-12)
    assert (tmp_path / "out" / "table7_or_by_level.csv").exists()
    # same seed, same CIs
    p2 = _run("metrics", "--pairs", str(tmp_path / "pairs.csv"), "--out", str(tmp_path / "out2"), "--n-boot", "200", "--seed", "1")
    assert p2.returncode == 0
    assert (tmp_path / "out" / "metrics.csv").read_bytes() == (tmp_path / "out2" / "metrics.csv").read_bytes()


def test_metrics_fitness_verdict(tmp_path):
    rng = np.random.default_rng(1)
    n = 200
    y = rng.integers(2, 6, n)
    pd.DataFrame({"pair_id": np.arange(n), "orig_sex": rng.choice(["F", "M"], n), "pred_orig": y, "pred_cf": y,
                  "condition": "full", "true_level": y}).to_csv(tmp_path / "pairs.csv", index=False)
    base = ["metrics", "--pairs", str(tmp_path / "pairs.csv"), "--n-boot", "50"]
    p = _run(*base, "--out", str(tmp_path / "unfit"), "--kappa-w", "0.00", "-0.06", "0.07")
    assert p.returncode == 0, p.stderr
    m = pd.read_csv(tmp_path / "unfit" / "metrics.csv")
    assert set(m.fit_for_audit) == {False} and "level prior" in m.fitness_reason[0]
    pdr = m.loc[m.metric == "PDR"].iloc[0]
    assert pdr.estimate == 0 and not pdr.fit_for_audit   # a zero PDR from an unfit model is not "no bias"
    p = _run(*base, "--out", str(tmp_path / "worse"), "--kappa-w", "0.30", "0.25", "0.38", "--baseline-kappa", "0.55")
    assert "clearly worse" in pd.read_csv(tmp_path / "worse" / "metrics.csv").fitness_reason[0]
    p = _run(*base, "--out", str(tmp_path / "fit"), "--kappa-w", "0.50", "0.41", "0.58", "--baseline-kappa", "0.55")
    assert set(pd.read_csv(tmp_path / "fit" / "table7_or_by_level.csv").fit_for_audit) == {True}


def _scored_pairs(rng, s, y, male_up):
    "A model's predictions of fixed pairs: random one-level changes, plus `male_up` of male originals moved up a level."
    yc = np.clip(y + rng.choice([-1, 0, 0, 0, 0, 0, 1], len(y)) + (s == "M") * (rng.random(len(y)) < male_up), 1, 5)
    return pd.DataFrame({"pair_id": np.arange(len(y)), "orig_sex": s, "pred_orig": y, "pred_cf": yc, "condition": "full"})


def test_metrics_null_emulators(tmp_path):
    """`--null FILE` (repeatable) and a `null_id` column: the permutation test over null emulators decides findings;
    a planted skew is found, a model with nothing planted is not, a null file that misses pairs is refused by name."""
    rng = np.random.default_rng(3)
    s, y = rng.choice(["F", "M"], 1200), rng.integers(1, 6, 1200)
    nulls = [tmp_path / f"null{k}.csv" for k in range(6)]
    for f in nulls:
        _scored_pairs(rng, s, y, 0.0).to_csv(f, index=False)
    kappa = ["--kappa-w", "0.50", "0.41", "0.58", "--n-boot", "100"]
    for name, male_up in (("biased", 0.3), ("fair", 0.0)):
        _scored_pairs(rng, s, y, male_up).to_csv(tmp_path / f"{name}.csv", index=False)
        p = _run("metrics", "--pairs", str(tmp_path / f"{name}.csv"), "--out", str(tmp_path / name), *kappa,
                 *[a for f in nulls for a in ("--null", str(f))])
        assert p.returncode == 0, p.stderr
    biased = pd.read_csv(tmp_path / "biased" / "null_test.csv").set_index(["condition", "metric"])
    assert biased.loc[("full", "female_skew"), "check"] == "primary" and biased.loc[("full", "female_skew"), "finding"]
    assert biased.loc[("full", "female_skew"), "n_null"] == 6 and biased.loc[("full", "female_skew"), "p"] < 0.01
    assert not pd.read_csv(tmp_path / "fair" / "null_test.csv").finding.any()
    assert len(pd.read_csv(tmp_path / "fair" / "null_emulators.csv")) == 6 * 11
    # the same null emulators as rows of the pairs CSV (null_id column): the same test, byte for byte
    both = pd.concat([pd.read_csv(tmp_path / "biased.csv").assign(null_id="")] +
                     [pd.read_csv(f).assign(null_id=f.stem) for f in nulls])
    both.to_csv(tmp_path / "both.csv", index=False)
    p = _run("metrics", "--pairs", str(tmp_path / "both.csv"), "--out", str(tmp_path / "both"), *kappa)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "both" / "null_test.csv").read_bytes() == (tmp_path / "biased" / "null_test.csv").read_bytes()
    pd.read_csv(nulls[0]).iloc[5:].to_csv(tmp_path / "short.csv", index=False)
    p = _run("metrics", "--pairs", str(tmp_path / "fair.csv"), "--out", str(tmp_path / "o"), "--null", str(nulls[1]),
             "--null", str(tmp_path / "short.csv"))
    assert p.returncode == 2 and "null emulator 'short'" in p.stderr and "5 pair_id(s)" in p.stderr


def test_metrics_bad_input_is_a_clear_error(tmp_path):
    (tmp_path / "bad.csv").write_text("pair_id,orig_sex,pred_orig,condition\n1,F,3,full\n")
    p = _run("metrics", "--pairs", str(tmp_path / "bad.csv"), "--out", str(tmp_path / "o"))
    assert p.returncode == 2
    assert "pred_cf" in p.stderr and "bad.csv" in p.stderr


def test_swap_text_cli(tmp_path):
    p = _run("swap-text", "--lang", "en", "--to", "female", "45M with chest pain, his wife says he fainted")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "45F with chest pain, her wife says she fainted"
    p = _run("swap-text", "--lang", "fr", "--to", "male", "Patiente âgée de 70 ans, amenée par sa fille.")
    assert p.stdout.strip() == "Patient âgé de 70 ans, amené par sa fille."
    (tmp_path / "in.tsv").write_text("id\ttext\n1\tShe is anxious.\n2\tKnown prostate cancer, he is stable.\n")
    p = _run("swap-text", "--lang", "en", "--to", "male", "--file", str(tmp_path / "in.tsv"), "--out", str(tmp_path / "out.tsv"))
    assert p.returncode == 0, p.stderr
    out = pd.read_csv(tmp_path / "out.tsv", sep="\t")
    assert out.loc[0, "text"] == "He is anxious." and out.loc[0, "swap_status"] == "ok"
    assert out.loc[1, "swap_status"] == "excluded"  # sex-specific content is excluded, never rewritten
    # the few-shot LLM g is tested in test_rewrite_llm.py (fake server, tiny model); here only its argument errors
    p = _run("swap-text", "--lang", "en", "--to", "male", "--method", "llm", "--backend", "openai", "She is anxious.")
    assert p.returncode == 2 and "--base-url" in p.stderr


def test_set_overrides_are_yaml_values():
    from triage_cf.chain import parse_overrides
    assert parse_overrides(["ft_num_processes=2", "ft_eval_views=[full, tab_iso]", "ft_train_n=null", "ft_base_url=",
                            "fs_profile=default", "ft_lr=1.0e-3", "ft_weight_decay=1e-2", "ft_model='1e5'"]) == {
        "ft_num_processes": 2, "ft_eval_views": ["full", "tab_iso"], "ft_train_n": None, "ft_base_url": None,
        "fs_profile": "default", "ft_lr": 1e-3, "ft_weight_decay": 0.01, "ft_model": "1e5"}   # YAML 1.2 floats; quoted: str
    for bad in ("ft_num_processes", "=2", "two words=1", "x=[unclosed"):
        with pytest.raises(ValueError, match="--set"):
            parse_overrides([bad])


def test_reproduce_refuses_a_malformed_set(tmp_path):
    p = _run("reproduce", "--dataset", "synth-en", "--profile", "smoke", "--out", str(tmp_path / "run"), "--set", "n_boot")
    assert p.returncode == 2 and "--set 'n_boot': expected KEY=VALUE" in p.stderr
    assert not (tmp_path / "run").exists()   # nothing ran


def test_python_m_is_the_console_script(tmp_path):
    """`python -m triage_cf.cli` (tests/_smoke_runs.py's fallback) runs `main` as the console script does, exit code
    included: the module's `__main__` guard fires there, and only there (not when its notebook runs)."""
    def run_m(*args):
        return subprocess.run([sys.executable, "-m", "triage_cf.cli", *args], capture_output=True, text=True)
    p = run_m("fetch", "--dataset", "mimic-iv-ed", "--data-root", str(tmp_path / "data"))
    assert p.returncode == 3 and "credentialed" in p.stderr and p.stdout == ""
    p, q = run_m("fetch", "--dataset", "synth-fr", "--data-root", str(tmp_path / "data")), \
        _run("fetch", "--dataset", "synth-fr", "--data-root", str(tmp_path / "data"))
    assert p.returncode == q.returncode == 0 and p.stdout == q.stdout and "nothing to fetch" in p.stdout
    assert not (tmp_path / "data").exists()


def test_subcommand_help_and_descriptions():
    "Each part's commands have their help; `probe-margins --help` carries its description (PROBE_MARGINS_DESCRIPTION)."
    from triage_cf.margins.cli import PROBE_MARGINS_DESCRIPTION
    p = _run("probe-margins", "--help")
    assert p.returncode == 0
    assert "OPENAI_API_KEY" in p.stdout and "pm_backend" in p.stdout and "--base-url BASE_URL" in p.stdout
    assert PROBE_MARGINS_DESCRIPTION.startswith("`triage-cf probe-margins --dataset NAME --out DIR` runs the chain")
    for cmd, option in (("fetch", "--base-url"), ("swap-text", "--method {rules,llm}"), ("plan", "--detect POINTS"),
                        ("triager", "--probe-run"), ("word-association", "--n-boot")):
        p = _run(cmd, "--help")
        assert p.returncode == 0 and option in p.stdout, (cmd, p.stdout)
