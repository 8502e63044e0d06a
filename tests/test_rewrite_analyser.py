"""g on the spaCy analyser (issue 26): the distance-agreement cases of tests/data/rewrite_agreement_cases.tsv (written
from grammar references, not from the rules), the rules' own cases on the analyser, the fallback to the rules when
the pipelines are absent, and the batched path."""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from triage_cf import rewrite
from triage_cf.rewrite import counterfactual_text, counterfactual_texts, g, load_analyser, rewriter_name, validate_rewrite

from test_rewrite import EN_CASES, FR_CASES

CASES_TSV = Path(__file__).parent / "data" / "rewrite_agreement_cases.tsv"


def _cases():
    with open(CASES_TSV, encoding="utf-8") as f:
        rows = list(csv.DictReader((l for l in f if not l.startswith("#")), delimiter="\t"))
    bad = [r for r in rows if r["lang"] not in ("en", "fr") or r["target"] not in ("F", "M") or not r["expected"]]
    if bad:
        raise ValueError(f"{CASES_TSV}: {len(bad)} malformed row(s): {bad[:2]}")
    return rows

CASES = _cases()

def _needs(lang):
    if load_analyser(lang) is None:
        pytest.skip(f"no spaCy pipeline for {lang} installed ({rewrite.ANALYSER_MODELS[lang]})")


def test_at_least_40_passing_cases_per_language_and_unique():
    for lang in ("en", "fr"):
        rows = [r for r in CASES if r["lang"] == lang]
        assert sum(not r["known_miss"] for r in rows) >= 40, lang
    assert len({(r["lang"], r["target"], r["text"]) for r in CASES}) == len(CASES)


@pytest.mark.parametrize("row", CASES, ids=lambda r: f"{r['lang']}-{r['text'][:40]}")
def test_agreement_case(row):
    _needs(row["lang"])
    got = g(row["text"], row["target"], row["lang"], analyser="spacy")
    if row["known_miss"]:
        assert got != row["expected"], f"known miss now passes, clear its known_miss: {row['text']!r}"
    else:
        assert got == row["expected"]


@pytest.mark.parametrize("row", CASES, ids=lambda r: f"{r['lang']}-{r['text'][:40]}")
def test_agreement_expectations_validate(row):
    "The expected rewrites change only gender words, by the unchanged validation (or name the word it does not know)."
    ok, why = validate_rewrite(row["text"], row["expected"], row["lang"])
    assert ok or "changed" in why, why


@pytest.mark.parametrize("lang,cases", [("en", EN_CASES), ("fr", FR_CASES)])
def test_rule_cases_hold_on_the_analyser(lang, cases):
    _needs(lang)
    got = rewrite.rewrite_analysed([c[1] for c in cases], [c[0] for c in cases], lang, load_analyser(lang))
    assert [(c[1], o) for c, o in zip(cases, got) if o != c[2]] == []


@pytest.mark.parametrize("lang,cases", [("en", EN_CASES), ("fr", FR_CASES)])
def test_rule_cases_hold_on_the_rules_alone(lang, cases):
    "The fallback (no pipeline installed, or analyser='none') is today's rules, unchanged."
    assert [(c[1], o) for c in cases if (o := g(c[1], c[0], lang, analyser="none")) != c[2]] == []


def test_the_issue_examples():
    _needs("fr")
    assert g("Mme Dupont, âgée de 80 ans, chute à domicile, retrouvée au sol par son voisin", "M", "fr") == \
        "M. Dupont, âgé de 80 ans, chute à domicile, retrouvé au sol par son voisin"
    assert g("patient alcoolisé, vu par son médecin", "F", "fr") == "patiente alcoolisée, vue par son médecin"
    assert g("Madame se dit épuisée", "M", "fr") == "Monsieur se dit épuisé"
    # the rules alone miss them (why the analyser is the default)
    assert g("Madame se dit épuisée", "M", "fr", analyser="none") == "Monsieur se dit épuisée"


def test_batched_equals_one_by_one():
    _needs("fr")
    rows = [r for r in CASES if r["lang"] == "fr"]
    batch = counterfactual_texts([r["text"] for r in rows], [r["target"] for r in rows], "fr", batch_size=7)
    assert batch == [counterfactual_text(r["text"], r["target"], "fr") for r in rows]
    assert counterfactual_texts([None, "grossesse", "Elle est tombée."], ["M"] * 3, "fr") == [
        (None, "missing", "no text"), (None, "excluded", "sex-specific content: 'grossesse'"), ("Il est tombé.", "ok", "ok")]


def test_fallback_to_the_rules_without_the_pipelines(monkeypatch):
    monkeypatch.setattr(rewrite, "load_analyser", lambda lang: None)
    assert rewriter_name("fr") == "rules (no spaCy pipeline installed)"
    assert g("Il est tombé.", "F", "fr") == "Elle est tombée."
    assert counterfactual_texts(["He fell."], ["F"], "en")[0].text == "She fell."
    with pytest.raises(RuntimeError, match="no spaCy pipeline"):
        g("Il est tombé.", "F", "fr", analyser="spacy")
    with pytest.raises(ValueError, match="analyser must be"):
        g("Il est tombé.", "F", "fr", analyser="stanza")


def test_rewriter_name_says_which_ran():
    for lang in ("en", "fr"):
        name = rewriter_name(lang)
        assert name.startswith("spacy ") if load_analyser(lang) is not None else name.startswith("rules"), name
    assert rewriter_name("en", "none") == "rules (analyser off)"


def test_spacy_is_imported_lazily():
    code = "import sys, triage_cf.rewrite as r; r.g('Il est tombé.', 'F', 'fr', analyser='none'); print('spacy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
