"""The synthetic cohorts (triage_cf.synth): determinism, the oracle's exact knob effects, sex-flipped twins,
other-sex renderings that differ only in gendered words, cue-free notes, and what the cohort filters exist for."""
import io
import re

import numpy as np
import pandas as pd
import pytest
from scipy.special import expit

from triage_cf import synth
from triage_cf.cohort import apply_cohort, load_terms, term_hits
from triage_cf.core import load_params, sha256_text
from triage_cf.data import canonicalize, load_manifest
from triage_cf.synth import (CUTPOINTS, DEFAULT_KNOBS, LEVELS, OTHER_SEX_COLUMNS, SEX_SPECIFIC_CC, TEXT_FIELDS,
                             exact_counterfactual_pair, generate_raw, oracle_latent, oracle_proba, oracle_predict,
                             text_sex_cue)

DS = {"fr": "synth-fr", "en": "synth-en"}
MAIN = {"fr": "hpi", "en": "note"}   # the note that carries the cue
N = 1500


@pytest.fixture(scope="module", params=["fr", "en"])
def cohort(request):
    "A 1,500-row raw cohort and its canonical records through the dataset's manifest (the chain's path)."
    lang = request.param
    raw = generate_raw(lang, N, seed=7)
    man = load_manifest(DS[lang])
    rec, dq = canonicalize(raw, man, DS[lang])
    return lang, raw, rec, dq, man


def _cum_logits(p):
    c = np.cumsum(p, axis=1)[:, :4]
    return np.log(c / (1 - c))


# ---------------------------------------------------------------- determinism

@pytest.mark.parametrize("lang", ["fr", "en"])
def test_same_seed_same_bytes(lang):
    a, b = generate_raw(lang, 1200, seed=3), generate_raw(lang, 1200, seed=3)
    pd.testing.assert_frame_equal(a, b)
    buf = lambda df: (lambda f: (df.to_parquet(f, index=False), f.getvalue())[1])(io.BytesIO())
    assert sha256_text(buf(a).hex()) == sha256_text(buf(b).hex())
    assert not a.equals(generate_raw(lang, 1200, seed=4))
    pd.testing.assert_frame_equal(a.head(700), generate_raw(lang, 700, seed=3))   # prefix-stable across blocks


def test_knob_acts_only_where_it_acts():
    a, b = generate_raw("fr", 600, seed=1), generate_raw("fr", 600, seed=1, typo_rate=0.0)
    changed = a.histoire_maladie != b.histoire_maladie
    assert 0.05 < changed.mean() < 0.2            # the rows with typos, nothing else
    pd.testing.assert_series_equal(a.cimu, b.cimu)  # a typo never changes what the nurses read


# ---------------------------------------------------------------- the oracle: documented direction and amount

def test_knobs_move_the_oracle_exactly(cohort):
    lang, raw, rec, _, _ = cohort
    cue_col = synth.CUE_COLUMN[lang]
    r = rec[rec.sex.eq("M") & rec[cue_col].eq("M") & rec[MAIN[lang]].notna()].head(200).copy()
    assert len(r) > 50
    bt, bx, s = 0.25, 0.4, 0.3
    kn = dict(bias_tab=bt, bias_text=bx, noise_scale=s)
    p_m = oracle_proba(r, lang, **kn)
    tab = r.assign(sex="F")
    txt = r.copy()
    for f, col in OTHER_SEX_COLUMNS[lang].items():
        txt[f] = r[col]
    full = txt.assign(sex="F")
    # cumulative logits shift by exactly -b/sigma (paper's latent-level units, ordered logit)
    np.testing.assert_allclose(_cum_logits(oracle_proba(tab, lang, **kn)) - _cum_logits(p_m), -bt / s, atol=1e-8)
    np.testing.assert_allclose(_cum_logits(oracle_proba(txt, lang, **kn)) - _cum_logits(p_m), -bx / s, atol=1e-8)
    np.testing.assert_allclose(_cum_logits(oracle_proba(full, lang, **kn)) - _cum_logits(p_m), -(bt + bx) / s, atol=1e-8)
    # expected level: exactly sum_k [L((c_k - mu)/s) - L((c_k - mu - b)/s)], positive (female: less severe)
    mu = oracle_latent(r, lang, **kn)
    want = (expit((CUTPOINTS - mu[:, None]) / s) - expit((CUTPOINTS - mu[:, None] - bt - bx) / s)).sum(1)
    got = oracle_proba(full, lang, **kn) @ LEVELS - p_m @ LEVELS
    np.testing.assert_allclose(got, want, atol=1e-10)
    assert (got > 0).all()
    # negative knobs move the other way; the sex field missing (text-iso) removes the tabular term only
    assert (oracle_proba(full, lang, bias_tab=-bt, bias_text=-bx, noise_scale=s) @ LEVELS < p_m @ LEVELS).all()
    np.testing.assert_allclose(oracle_latent(full.assign(sex=None), lang, **kn) - mu, bx, atol=1e-12)
    # empty text (tab-iso) removes the textual term and the note's severity phrases
    empty = full.copy()
    for f in TEXT_FIELDS[lang]:
        empty[f] = None
    base = oracle_latent(empty.assign(sex="M"), lang, **kn)
    np.testing.assert_allclose(oracle_latent(empty, lang, **kn) - base, bt, atol=1e-12)


def test_default_knobs_plant_a_modest_female_effect():
    for lang, kn in DEFAULT_KNOBS.items():
        assert 0 < kn["bias_tab"] < 0.05 and 0 < kn["bias_text"] < 0.05, (lang, kn)


def test_twins_identical_when_knobs_are_zero(cohort):
    lang, raw, rec, _, man = cohort
    c = apply_cohort(rec, man["cohort"]).cohort
    zero = dict(bias_tab=0.0, bias_text=0.0)
    x, cf = exact_counterfactual_pair(c, lang, "full")
    np.testing.assert_array_equal(oracle_proba(x, lang, **zero), oracle_proba(cf, lang, **zero))
    for view in ("text_iso", "tab_iso"):
        x, cf = exact_counterfactual_pair(c, lang, view)
        np.testing.assert_array_equal(oracle_proba(x, lang, **zero), oracle_proba(cf, lang, **zero))
    # not vacuous: with the default knobs some twins differ, always toward a higher level for the female side
    x, cf = exact_counterfactual_pair(c, lang, "full")
    ex, ecf = oracle_proba(x, lang) @ LEVELS, oracle_proba(cf, lang) @ LEVELS
    fem = (c.sex == "F").to_numpy()
    diff = np.where(fem, ex - ecf, ecf - ex)
    assert (diff > 0).mean() > 0.95 and (diff >= 0).all()
    assert (oracle_predict(x, lang) != oracle_predict(cf, lang)).any()


def test_levels_are_draws_of_the_oracle():
    "The dataset's labels are draws from oracle_proba of the records as recorded (binomial tolerance per level)."
    for lang in ("fr", "en"):
        raw = generate_raw(lang, 4000, seed=11)
        rec, _ = canonicalize(raw, load_manifest(DS[lang]), DS[lang])
        ok = rec.triage_level.notna()
        p = oracle_proba(rec[ok], lang).mean(0)
        freq = rec.triage_level[ok].value_counts(normalize=True).reindex(LEVELS, fill_value=0).to_numpy()
        se = np.sqrt(p * (1 - p) / ok.sum())
        assert (np.abs(freq - p) < 4 * se + 1e-9).all(), (lang, freq, p)


def test_oracle_rejects_bad_input(cohort):
    lang, _, rec, _, _ = cohort
    with pytest.raises(KeyError, match="cc_code"):
        oracle_proba(rec.drop(columns="cc_code"), lang)
    with pytest.raises(ValueError, match="sex"):
        oracle_proba(rec.assign(sex="U"), lang)
    with pytest.raises(ValueError, match="unknown class"):
        oracle_proba(rec.assign(cc_code="XX99"), lang)
    with pytest.raises(TypeError, match="unknown"):
        oracle_proba(rec, lang, bias_sex=0.1)


# ---------------------------------------------------------------- notes, renderings, cues

FR_PAIRS = {("il", "elle"), ("patient", "patiente"), ("homme", "femme"),
            ("monsieur", "madame"), ("m.", "mme"), ("mr", "mme"), ("m.", "mlle"), ("père", "mère"), ("le", "la"),
            ("un", "une"), ("âgé", "âgée"), ("connu", "connue"), ("amené", "amenée"), ("adressé", "adressée"),
            ("retrouvé", "retrouvée"), ("accompagné", "accompagnée"), ("suivi", "suivie"), ("opéré", "opérée"),
            ("hospitalisé", "hospitalisée"), ("tombé", "tombée"), ("allongé", "allongée"), ("agité", "agitée"),
            ("fatigué", "fatiguée"), ("gêné", "gênée"), ("retraité", "retraitée"), ("orienté", "orientée"),
            ("anxieux", "anxieuse"), ("inquiet", "inquiète"), ("seul", "seule"), ("veuf", "veuve"),
            ("sportif", "sportive"), ("fumeur", "fumeuse"), ("ancien", "ancienne"), ("conscient", "consciente"),
            ("confus", "confuse")}
EN_PAIRS = {("he", "she"), ("him", "her"), ("his", "her"), ("himself", "herself"), ("man", "woman"),
            ("male", "female"), ("gentleman", "lady"), ("boy", "girl"), ("widower", "widow"), ("father", "mother"),
            ("mr.", "mrs."), ("mr.", "ms."), ("m", "f")}
TOKEN = re.compile(r"(?:Mrs|Mr|Ms|M)\.(?=\s)|\d+|[^\W\d_]+(?:['’-][^\W\d_]+)*|\S")   # titles keep their period; "45M" -> 45, M


def _diff_ok(a, b, orig_sex, pairs):
    "Same tokens except (masculine, feminine) pairs of the lexicon, in the direction of the original sex."
    ta, tb = TOKEN.findall(a), TOKEN.findall(b)
    if len(ta) != len(tb):
        return False, f"token counts differ: {len(ta)} vs {len(tb)}"
    for u, v in zip(ta, tb):
        if u == v:
            continue
        m, f = (u, v) if orig_sex == "M" else (v, u)
        if (m.lower(), f.lower()) not in pairs:
            return False, f"{u!r} -> {v!r} is not a gender pair"
        if u[:1].isupper() != v[:1].isupper():
            return False, f"case changed: {u!r} -> {v!r}"
    return True, ""


def test_rendering_differs_only_in_gendered_words(cohort):
    lang, raw, _, _, _ = cohort
    pairs = FR_PAIRS if lang == "fr" else EN_PAIRS
    fields = {"fr": [("histoire_maladie", "histoire_maladie_autre_sexe"), ("antecedents", "antecedents_autre_sexe")],
              "en": [("triage_note", "triage_note_other_sex")]}[lang]
    cue_col = {"fr": "indice_sexe_texte", "en": "note_sex_cue"}[lang]
    sexes = raw[{"fr": "sexe", "en": "gender"}[lang]]
    true_sex = raw[cue_col].where(raw[cue_col].notna(), None)
    n_changed = 0
    for orig, other in fields:
        ok = raw[orig].notna()
        assert (raw[other].notna() == ok).all()
        for i in np.flatnonzero(ok):
            a, b = raw[orig].iat[i], raw[other].iat[i]
            sx = true_sex.iat[i]
            if sx is None:      # cue-free note: its rendering is itself
                assert a == b, a
                continue
            good, why = _diff_ok(a, b, sx, pairs)
            assert good, f"row {i}: {why}\n{a}\n{b}"
            n_changed += a != b
    assert n_changed > 0.6 * (~true_sex.isna()).sum()
    # words about other people and impersonal pronouns never change (the token test alone would accept il -> elle)
    keep = (r"\bil y a\b|\b(?:sa|son) (?:fille|fils|mari|femme|voisin|voisine|épouse|époux|compagne|compagnon)\b|l'infirmi"
            if lang == "fr" else r"\b(?:wife|husband|daughter|son|neighbor|boyfriend|girlfriend|mother|father)\b")
    n_kept = 0
    for orig, other in fields:
        a, b = raw[orig].dropna(), raw[other].dropna()
        assert (a.str.count(keep) == b.str.count(keep)).all()
        n_kept += a.str.count(keep).sum()
    assert n_kept > 50


def test_cues_and_cue_free_share(cohort):
    lang, raw, rec, _, _ = cohort
    cue_col = synth.CUE_COLUMN[lang]
    text = lambda df, cols: df[cols].apply(lambda r: "\n".join(x for x in r if isinstance(x, str)), axis=1)
    has_text = rec[MAIN[lang]].notna()
    orig = text(rec[has_text], TEXT_FIELDS[lang]).map(lambda s: text_sex_cue(s, lang))
    cf_cols = [OTHER_SEX_COLUMNS[lang].get(f, f) for f in TEXT_FIELDS[lang]]
    cf = text(rec[has_text], cf_cols).map(lambda s: text_sex_cue(s, lang))
    want = rec.loc[has_text, cue_col].astype(object).where(rec.loc[has_text, cue_col].notna(), None)
    assert (orig.fillna("none") == want.fillna("none")).all()
    assert (cf.fillna("none") == want.map({"F": "M", "M": "F"}).fillna("none")).all()
    # the cue is the patient's sex, and the cue-free share is the knob's
    sex = rec.loc[has_text, "sex"].astype(object)
    both = want.notna() & sex.notna()
    assert (want[both] == sex[both]).all()
    share = want.isna().mean()
    k = DEFAULT_KNOBS[lang]["no_cue_share"]
    assert abs(share - k) < 4 * np.sqrt(k * (1 - k) / len(want))
    none = generate_raw(lang, 200, seed=2, no_cue_share=1.0)
    col = {"fr": "histoire_maladie", "en": "triage_note"}[lang]
    assert none[col].dropna().map(lambda s: text_sex_cue(s, lang)).isna().all()
    allc = generate_raw(lang, 200, seed=2, no_cue_share=0.0)
    assert allc[synth.CUE_COLUMN[lang][2:]].notna().all()


def test_notes_are_varied(cohort):
    lang, raw, _, _, _ = cohort
    col = {"fr": "histoire_maladie", "en": "triage_note"}[lang]
    notes = raw[col].dropna()
    first = notes.map(lambda s: re.sub(r"\d+", "#", s.split(".")[0])[:25])
    assert first.nunique() > 60                                                  # many openings
    assert notes.str.contains(r"\d").mean() > 0.5                                # numbers
    neg = r"\b(?:pas de|sans|nie)\b" if lang == "fr" else r"\b(?:no|denies|not)\b"
    assert notes.str.contains(neg, case=False).mean() > 0.3                      # negations
    abbr = r"\b(?:ATCD|EVA|TA|DT|PC|AA|SAMU|MT)\b" if lang == "fr" else r"\b(?:c/o|w/|PMH|Hx|pt|Pt|BIBA|x)\b"
    assert notes.str.contains(abbr).mean() > 0.3                                 # abbreviations
    assert raw[synth.CUE_COLUMN[lang][2:]].value_counts().min() > 0.2 * len(raw)  # both sexes' cues


# ---------------------------------------------------------------- raw schema, manifest, cohort filters

def test_raw_schema_and_manifest(cohort):
    lang, raw, rec, dq, man = cohort
    assert list(raw.columns) == synth.RAW_COLUMNS[lang] + synth.EXTRA_COLUMNS[lang]
    if lang == "fr":
        assert raw.date_entree.str.fullmatch(r"20(1[3-9]|2[01])-\d\d-\d\d \d\d:\d\d").all()
        assert set(raw.sexe.dropna()) == {"H", "F"} and set(raw.ide_sexe.dropna()) == {"H", "F"}
        assert raw.temperature.dropna().between(30, 43).all()
        assert set(raw.ide_formation_tri.dropna()) == {0, 1}
    else:
        assert raw.temperature.dropna().between(86, 110).all()                   # Fahrenheit
        assert set(raw.gender.dropna()) == {"F", "M"}
    assert len(CLASSES := synth.CC_CLASSES) >= 36 and set(SEX_SPECIFIC_CC) <= set(CLASSES.code)
    # the manifest's mapping loses nothing: no unknown code, unparseable or implausible value
    bad = dq[dq.issue.isin(["unknown_code", "unparseable", "implausible", "out_of_scale"])]
    assert bad.empty, bad
    # the oracle reads the loader's records exactly as the generator's own canonical view
    internal = synth._generate(lang, N, 7, {})[1]
    np.testing.assert_allclose(oracle_proba(rec, lang), oracle_proba(internal, lang), atol=1e-12)
    assert set(OTHER_SEX_COLUMNS[lang].values()) <= set(rec.columns)


def test_codes_and_labels_match_the_cohort_lists():
    assert load_terms("synth_sex_specific_cc_codes.txt") == list(SEX_SPECIFIC_CC)
    fr_labels = set(load_terms("sex_specific_cc_classes.txt"))
    assert set(synth.CC_CLASSES.set_index("code").loc[list(SEX_SPECIFIC_CC), "label_fr"]) <= fr_labels
    assert not set(synth.CC_CLASSES.set_index("code").drop(list(SEX_SPECIFIC_CC)).label_fr) & fr_labels


@pytest.mark.parametrize("lang", ["fr", "en"])
def test_raw_cohorts_contain_what_each_filter_exists_for(lang):
    par = load_params(DS[lang], "smoke")
    raw = generate_raw(lang, seed=par["seed"], **par["synth"])
    assert 200 <= len(raw) <= 1000
    man = load_manifest(DS[lang])
    rec, _ = canonicalize(raw, man, DS[lang])
    flow = apply_cohort(rec, man["cohort"]).flow
    kind = flow.rule.where(~flow.rule.str.startswith("missing_"), "missing_*")
    removed = flow.groupby(kind).n_removed.sum()
    assert (removed > 0).all(), removed       # every rule removes something
    if lang == "fr":
        assert (pd.to_datetime(raw.date_entree) < "2016-01-01").any() and raw.cimu.eq(1).any()
    else:
        assert raw.acuity.eq(5).any() and raw.acuity.eq(1).any()


def test_appendix_terms_only_in_sex_specific_records(cohort):
    "Every Appendix A term hit (the paper's case-insensitive substrings) is planted on purpose, and most plants hit."
    lang, raw, rec, _, _ = cohort
    terms = load_terms(f"exclusion_terms_{lang}.txt")
    fields = ["hpi", "pmh"] if lang == "fr" else ["cc_text", "note"]
    hit = pd.concat([term_hits(rec[f], terms).any(axis=1) for f in fields], axis=1).any(axis=1)
    flag = rec[synth.SEX_SPECIFIC_COLUMN[lang]].eq(1)
    assert not (hit & ~flag).any(), rec.loc[hit & ~flag, fields].head()
    planted = flag & ~rec.cc_code.isin(SEX_SPECIFIC_CC) & rec[fields[-1]].notna()
    assert hit[planted].mean() > 0.9


@pytest.mark.parametrize("lang", ["fr", "en"])
def test_params_profiles(lang):
    sizes = {p: load_params(DS[lang], p)["synth"]["n_records"] for p in ("smoke", "default", "paper")}
    assert sizes["smoke"] < 1000 and 2000 <= sizes["default"] <= 4000 and sizes["paper"] > 50_000
    kn = {k: v for k, v in load_params(DS[lang], "paper")["synth"].items() if k != "n_records"}
    assert len(generate_raw(lang, 10, seed=1, **kn)) == 10          # every configured knob is a known knob


def _case_mix_pvalues(lang: str, c: float, seed: int, n: int = 3000) -> tuple[float, float]:
    "(complaint class x sex chi-squared p, age by sex Welch t p) of the sex-independent classes of a cohort."
    from scipy.stats import chi2_contingency, ttest_ind
    from triage_cf.synth import SEX_SPECIFIC_CC, _generate
    _, cn = _generate(lang, n, seed, dict(case_mix_by_sex=c))
    cn = cn[cn.sex.notna() & cn.cc_code.notna() & ~cn.cc_code.isin(SEX_SPECIFIC_CC) & (cn.age >= 18)]
    return (chi2_contingency(pd.crosstab(cn.cc_code, cn.sex))[1],
            ttest_ind(cn.age[cn.sex == "F"], cn.age[cn.sex == "M"], equal_var=False).pvalue)


@pytest.mark.parametrize("lang", ["en", "fr"])
def test_case_mix_by_sex_default_is_visible_at_3000(lang):
    "The default cohorts (case_mix_by_sex 1.0): complaints and age differ by sex beyond chance at 3,000 records, 5 seeds."
    for seed in (101, 202, 303, 404, 505):
        p_cc, p_age = _case_mix_pvalues(lang, 1.0, seed)
        assert p_cc < 0.05 and p_age < 0.05, (lang, seed, p_cc, p_age)


@pytest.mark.parametrize("lang", ["en", "fr"])
def test_case_mix_by_sex_zero_is_the_old_generator(lang):
    "case_mix_by_sex 0: the complaint weights of both sexes are equal, and no sex effect on the oracle's knobs."
    from triage_cf.synth import _generate, class_weights
    np.testing.assert_array_equal(class_weights(lang, "F", 0.0), class_weights(lang, "M", 0.0))
    _, c0 = _generate(lang, 1500, 9, dict(case_mix_by_sex=0.0))
    _, c1 = _generate(lang, 1500, 9, dict(case_mix_by_sex=1.0))
    assert (c0.sex.fillna("") == c1.sex.fillna("")).all()        # sex is drawn first, from the same uniform
    assert not c0.cc_code.equals(c1.cc_code)                       # the complaint mix is what the knob changes
    with pytest.raises(ValueError, match="case_mix_by_sex"):
        _generate(lang, 10, 1, dict(case_mix_by_sex=-1.0))
