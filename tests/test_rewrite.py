"""Rule-based rewriting function g (paper sections 2.2, 2.4) and its validation.

Every case is written from the rules: the patient's gendered words take the target sex, words about other
people keep their gender, nothing else changes (numbers, units, negations, drugs, abbreviations, spelling errors,
punctuation, spacing, case, words merely containing a gendered string)."""
from __future__ import annotations

import unicodedata

import pandas as pd
import pytest

from triage_cf.audit.review import REVIEW_CATEGORIES, export_review_sample, review_agreement
from triage_cf.rewrite import SexSpecificContent, counterfactual_text, g, is_sex_specific, load_lexicon, validate_rewrite
from triage_cf.audit.rewrite_llm import swap_text, swap_tsv

# (target_sex, original, expected rewrite)
EN_CASES = [
    # pronouns
    ("F", "He is a 45 yo man with chest pain.", "She is a 45 yo woman with chest pain."),
    ("M", "She states her chest hurts.", "He states his chest hurts."),
    ("F", "Pt hit himself with a hammer.", "Pt hit herself with a hammer."),
    ("M", "She cut herself while cooking.", "He cut himself while cooking."),
    ("F", "He's had 2 falls; his son says he's weaker.", "She's had 2 falls; her son says she's weaker."),
    ("M", "Per EMS, her BP was 80/40 and she was diaphoretic.", "Per EMS, his BP was 80/40 and he was diaphoretic."),
    # "her" -> him / his by role
    ("M", "Daughter found her on the floor.", "Daughter found him on the floor."),
    ("M", "EMS gave her aspirin 324 mg.", "EMS gave him aspirin 324 mg."),
    ("M", "Her husband brought her in.", "His husband brought him in."),
    ("M", "Found her unresponsive at home.", "Found him unresponsive at home."),
    ("M", "Family brought her home.", "Family brought him home."),
    ("M", "Fell at her home.", "Fell at his home."),
    ("M", "Asked her to return if worse.", "Asked him to return if worse."),
    ("M", "Gave her 2 tabs of Tylenol.", "Gave him 2 tabs of Tylenol."),
    ("M", "Made her feel dizzy.", "Made him feel dizzy."),
    ("M", "She told the nurse her pain is 8/10.", "He told the nurse his pain is 8/10."),
    ("M", "Her boyfriend is with her.", "His boyfriend is with him."),
    ("M", "Woman, 30s, with her 2 kids.", "Man, 30s, with his 2 kids."),
    ("M", "Pain started after her run; it woke her.", "Pain started after his run; it woke him."),
    # his / hers
    ("F", "The phone is his.", "The phone is hers."),
    ("M", "The phone is hers.", "The phone is his."),
    # other people keep their gender
    ("F", "His wife called 911.", "Her wife called 911."),
    ("F", "His mother reports he fell.", "Her mother reports she fell."),
    ("F", "His father has CAD.", "Her father has CAD."),
    ("F", "Seen by male nurse, pt is male.", "Seen by male nurse, pt is female."),
    ("F", "Assaulted by a man; he has a lac to his forehead.", "Assaulted by a man; she has a lac to her forehead."),
    ("F", "Pt found by another man, he is bleeding.", "Pt found by another man, she is bleeding."),
    ("M", "Lady found down by her neighbor.", "Gentleman found down by his neighbor."),
    ("F", "Pt's mother is at bedside, he is calm.", "Pt's mother is at bedside, she is calm."),
    # nouns and titles
    ("F", "Elderly gentleman with SOB.", "Elderly lady with SOB."),
    ("M", "Young girl, 16, fell off bike.", "Young boy, 16, fell off bike."),
    ("F", "Boy, 12, hurt his wrist playing soccer.", "Girl, 12, hurt her wrist playing soccer."),
    ("F", "Mr. Smith is a 70 yo male.", "Ms. Smith is a 70 yo female."),
    ("M", "Mrs Jones, 80, fall.", "Mr Jones, 80, fall."),
    ("M", "Pt is a widow who lives alone.", "Pt is a widower who lives alone."),
    ("F", "The man's leg is swollen.", "The woman's leg is swollen."),
    ("M", "She is a mother of 3.", "He is a father of 3."),
    ("F", "Father of 2, works nights.", "Mother of 2, works nights."),
    ("F", "Father of thhree.", "Mother of thhree."),                          # a typo does not hide the kin rule
    ("F", "Mother of pt at bedside, he is calm.", "Mother of pt at bedside, she is calm."),
    # age-sex shorthand, never a temperature
    ("F", "45M with CP x2 days.", "45F with CP x2 days."),
    ("M", "62 yo F c/o dizziness.", "62 yo M c/o dizziness."),
    ("F", "45 y/o M w/ SOB", "45 y/o F w/ SOB"),
    ("F", "Temp 101F, 45M febrile.", "Temp 101F, 45F febrile."),
    ("M", "fever to 102F at home, she took ibuprofen", "fever to 102F at home, he took ibuprofen"),
    ("F", "sex: M, age 40", "sex: F, age 40"),
    # nothing else changes: words containing gendered strings, negations, drugs, typos, spacing, case
    ("F", "History of hernia, sees a therapist, works as a shepherd, can manage at home, theme park.",
     "History of hernia, sees a therapist, works as a shepherd, can manage at home, theme park."),
    ("M", "History of hernia, sees a therapist, works as a shepherd, can manage at home, theme park.",
     "History of hernia, sees a therapist, works as a shepherd, can manage at home, theme park."),
    ("F", "He denies CP, no SOB, takes metoprolol 25mg BID, recieved asprin.",
     "She denies CP, no SOB, takes metoprolol 25mg BID, recieved asprin."),
    ("M", "She  fell ,  hit her head!!", "He  fell ,  hit his head!!"),
    ("F", "HE FELL AND HIT HIS HEAD", "SHE FELL AND HIT HER HEAD"),
    ("F", "Hx of HE, he is confused.", "Hx of HE, she is confused."),
    ("F", "No change: chest pain 2 days, BP 140/90, HR 110.", "No change: chest pain 2 days, BP 140/90, HR 110."),
    ("F", "Line one: he fell.\nLine two: his arm hurts.", "Line one: she fell.\nLine two: her arm hurts."),
]

FR_CASES = [
    # il / elle, agreement with the patient
    ("M", "Patiente de 45 ans, connue pour HTA.", "Patient de 45 ans, connu pour HTA."),
    ("F", "Patient âgé de 80 ans, retrouvé au sol par son voisin.", "Patiente âgée de 80 ans, retrouvée au sol par son voisin."),
    ("M", "Elle vit seule, veuve, anxieuse.", "Il vit seul, veuf, anxieux."),
    ("F", "Il est amené par les pompiers.", "Elle est amenée par les pompiers."),
    ("M", "Sa fille l'a retrouvée au sol.", "Sa fille l'a retrouvé au sol."),
    ("F", "Son fils, inquiet, l'a amené.", "Son fils, inquiet, l'a amenée."),
    ("M", "Madame X. Sa fillle, inquiète, l'accompagne.", "Monsieur X. Sa fillle, inquiète, l'accompagne."),  # misspelt relative
    ("M", "Une femme de 30 ans, sportive, tabagique.", "Un homme de 30 ans, sportif, tabagique."),
    ("M", "La patiente, fumeuse, est inquiète.", "Le patient, fumeur, est inquiet."),
    ("F", "Il est sportif, non fumeur.", "Elle est sportive, non fumeuse."),
    ("F", "Il se sent seul et angoissé.", "Elle se sent seule et angoissée."),
    ("M", "Elle est veuve depuis 2019.", "Il est veuf depuis 2019."),
    ("F", "Patient inquiet pour sa santé.", "Patiente inquiète pour sa santé."),
    ("M", "Elle a été hospitalisée en 2019.", "Il a été hospitalisé en 2019."),
    ("F", "Qu'il soit seul ou non.", "Qu'elle soit seule ou non."),
    ("M", "Vit seule à domicile.", "Vit seul à domicile."),
    ("F", "Il est retrouvé au sol.", "Elle est retrouvée au sol."),
    ("F", "Ancien fumeur, il est sportif.", "Ancienne fumeuse, elle est sportive."),
    ("M", "Patiente ex-fumeuse.", "Patient ex-fumeur."),
    ("F", "A-t-il chuté ?", "A-t-elle chuté ?"),
    ("M", "Elle rentre chez elle.", "Il rentre chez lui."),
    ("F", "Il rentre chez lui.", "Elle rentre chez elle."),
    ("M", "On la retrouve au sol.", "On le retrouve au sol."),
    # invariable words stay
    ("F", "Le patient est diabétique et allergique à la pénicilline.", "La patiente est diabétique et allergique à la pénicilline."),
    ("M", "Patiente tabagique, diabétique, allergique.", "Patient tabagique, diabétique, allergique."),
    # nouns, titles, determiners
    ("F", "Monsieur Dupont, 70 ans.", "Madame Dupont, 70 ans."),
    ("M", "Mme Martin est connue du service.", "M. Martin est connu du service."),
    ("F", "M. Martin est connu du service.", "Mme Martin est connue du service."),
    ("M", "Jeune femme de 22 ans.", "Jeune homme de 22 ans."),
    ("F", "Un jeune homme de 19 ans.", "Une jeune femme de 19 ans."),
    ("F", "L'homme est retrouvé inconscient.", "La femme est retrouvée inconsciente."),
    ("M", "La femme est tombée.", "L'homme est tombé."),
    ("F", "Cet homme de 60 ans est confus.", "Cette femme de 60 ans est confuse."),
    ("M", "Cette femme de 60 ans est confuse.", "Cet homme de 60 ans est confus."),
    ("M", "Transfert de la patiente au bloc.", "Transfert du patient au bloc."),
    ("F", "Appel du patient au domicile.", "Appel de la patiente au domicile."),
    ("M", "Examen de la femme âgée.", "Examen de l'homme âgé."),
    ("F", "Il s'agit d'un homme de 50 ans.", "Il s'agit d'une femme de 50 ans."),
    ("M", "Mère de 3 enfants, vit avec son mari.", "Père de 3 enfants, vit avec son mari."),
    ("F", "sexe : H", "sexe : F"),
    # other people keep their gender; possessives agree with the possessed noun
    ("F", "Son fils est inquiet.", "Son fils est inquiet."),
    ("M", "Sa fille est inquiète.", "Sa fille est inquiète."),
    ("F", "Sa mère est diabétique.", "Sa mère est diabétique."),
    ("F", "Sa femme l'accompagne.", "Sa femme l'accompagne."),
    ("M", "Son voisin l'a amenée aux urgences.", "Son voisin l'a amené aux urgences."),
    ("F", "L'infirmier note que le patient est anxieux.", "L'infirmier note que la patiente est anxieuse."),
    ("M", "La patiente est accompagnée de son fils, inquiet.", "Le patient est accompagné de son fils, inquiet."),
    ("F", "Le patient est accompagné de sa fille, inquiète.", "La patiente est accompagnée de sa fille, inquiète."),
    ("F", "On lui a donné du paracétamol.", "On lui a donné du paracétamol."),
    # impersonal il and things
    ("F", "Il y a une douleur thoracique.", "Il y a une douleur thoracique."),
    ("F", "Il faut surveiller la TA.", "Il faut surveiller la TA."),
    ("F", "Il reste une douleur résiduelle.", "Il reste une douleur résiduelle."),
    ("F", "Il reste calme.", "Elle reste calme."),
    ("F", "Selon sa fille, il srait plus confus.", "Selon sa fille, elle srait plus confuse."),   # misspelt verb
    ("F", "Il est retrouvé une plaie du scalp.", "Il est retrouvé une plaie du scalp."),
    ("M", "Douleur thoracique, elle irradie dans le bras gauche.", "Douleur thoracique, elle irradie dans le bras gauche."),
    ("F", "HTA connue, diabète connu, il est fumeur.", "HTA connue, diabète connu, elle est fumeuse."),
    ("F", "Il a retrouvé ses clés.", "Elle a retrouvé ses clés."),
    ("F", "Le seul traitement est le repos.", "Le seul traitement est le repos."),
    ("F", "Les patients de la salle sont calmes.", "Les patients de la salle sont calmes."),
    # nothing else changes: numbers, negations, drugs, typos, spacing, case, words containing gendered strings
    ("F", "Il présente une douleur de 7/10 à l'EVA, non irradiante.", "Elle présente une douleur de 7/10 à l'EVA, non irradiante."),
    ("M", "Patiente  de 45ans ,tabagique ,connue pr HTA , pas de fievre", "Patient  de 45ans ,tabagique ,connu pr HTA , pas de fievre"),
    ("M", "LA PATIENTE EST TOMBÉE.", "LE PATIENT EST TOMBÉ."),
    ("F", "Il prend de l'amoxicilline, hémoglobine normale, pilule oubliée? non", "Elle prend de l'amoxicilline, hémoglobine normale, pilule oubliée? non"),
    ("M", "Patiente examinée par l'infirmière, baisse de la vue.", "Patient examiné par l'infirmière, baisse de la vue."),
]


@pytest.mark.parametrize("target,text,expected", EN_CASES)
def test_g_english(target, text, expected):
    assert g(text, target, "en") == expected


@pytest.mark.parametrize("target,text,expected", FR_CASES)
def test_g_french(target, text, expected):
    assert g(text, target, "fr") == expected


def test_case_counts():
    assert len(EN_CASES) >= 40 and len(FR_CASES) >= 40


@pytest.mark.parametrize("lang,cases", [("en", EN_CASES), ("fr", FR_CASES)])
def test_every_expected_rewrite_validates(lang, cases):
    "The rules' own outputs pass the automatic validation (only lexicon words changed)."
    for _, text, expected in cases:
        ok, why = validate_rewrite(text, expected, lang)
        assert ok, (text, expected, why)


ROUND_TRIP = [
    ("en", "F", "She is a 50 yo woman; her husband found her on the floor and she hit her head."),
    ("en", "M", "He is a 50 yo man; his wife found him on the floor and he hit his head."),
    ("en", "F", "45F, Ms. Brown, fell at her home, no LOC. She denies CP."),
    ("fr", "F", "Patiente de 82 ans, veuve, vit seule. Elle est retrouvée au sol par sa fille, anxieuse."),
    ("fr", "M", "Patient de 82 ans, veuf, vit seul. Il est retrouvé au sol par sa fille, inquiète."),
    ("fr", "M", "M. Durand, ancien fumeur, connu pour HTA, est amené par les pompiers. Il rentre chez lui."),
]


@pytest.mark.parametrize("lang,sex,text", ROUND_TRIP)
def test_round_trip(lang, sex, text):
    other = "M" if sex == "F" else "F"
    once = g(text, other, lang)
    assert once != text
    assert g(once, sex, lang) == text


def test_target_sex_words_are_left_alone():
    "Rewriting to F only edits masculine words: an already-female note is unchanged."
    assert g("She fell; her husband called.", "F", "en") == "She fell; her husband called."
    assert g("Elle est tombée, son mari est inquiet.", "F", "fr") == "Elle est tombée, son mari est inquiet."


def test_sex_specific_records_are_excluded_not_rewritten():
    with pytest.raises(SexSpecificContent):
        g("Patiente enceinte de 8 SA.", "M", "fr")
    with pytest.raises(SexSpecificContent):
        g("He has a hx of prostate cancer.", "F", "en")
    assert is_sex_specific("Antécédent d'hystérectomie", "fr")
    assert counterfactual_text("s/p hysterectomy, she fell", "M", "en").status == "excluded"


def test_method_argument():
    "rules | llm (the few-shot LLM g is tested in test_rewrite_llm.py); an LLM method needs an LLMRewriter."
    with pytest.raises(ValueError, match="needs rewriter="):      # the rule-based module never builds a model
        counterfactual_text("he fell", "F", "en", method="llm")
    with pytest.raises(ValueError, match="method must be"):
        g("he fell", "F", "en", method="gpt")
    with pytest.raises(TypeError, match="LLMRewriter"):
        swap_text("he fell", "en", "female", method="llm", rewriter=object())
    assert counterfactual_text("Hx of prostate cancer", "F", "en", method="llm").status == "excluded"  # no model needed


def test_bad_arguments():
    with pytest.raises(ValueError, match="target_sex"):
        g("he", "female", "en")
    with pytest.raises(ValueError, match="lang"):
        g("he", "F", "de")
    with pytest.raises(TypeError):
        g(None, "F", "en")


# ---- validation -------------------------------------------------------------------------------------------------

def test_validate_accepts_gender_only_changes():
    assert validate_rewrite("He is a 45M, his BP 120/80.", "She is a 45F, her BP 120/80.", "en") == (True, "ok")
    assert validate_rewrite("Mme X est connue, de la patiente", "M. X est connu, du patient", "fr") == (True, "ok")
    assert validate_rewrite("A-t-il chuté ? Ancien fumeur.", "A-t-elle chuté ? Ancienne fumeuse.", "fr") == (True, "ok")


@pytest.mark.parametrize("lang,orig,new,needle", [
    ("en", "She is 45, no fever.", "He is 46, no fever.", "'45' -> '46'"),
    ("en", "She denies chest pain.", "He reports chest pain.", "denies"),
    ("en", "No SOB. She fell.", "SOB. He fell.", "deleted 'No'"),
    ("en", "She takes aspirin.", "He takes aspirin daily.", "inserted 'daily'"),
    ("en", "Her metoprolol 25 mg", "His metoprolol 50 mg", "'25' -> '50'"),
    ("fr", "Elle ne fume pas.", "Il fume.", "deleted"),
    ("fr", "Patiente connue pour HTA.", "Patient connu pour diabète.", "'HTA' -> 'diabète'"),
    ("fr", "Elle est tombée, 38.5°C.", "Il est tombé, 38.2°C.", "38.5"),
    ("fr", "Elle est diabétique.", "Il est diabetique.", "diabétique"),
    ("fr", "Elle est tombée.", "", "empty rewrite"),
])
def test_validate_rejects_other_changes(lang, orig, new, needle):
    ok, why = validate_rewrite(orig, new, lang)
    assert not ok and needle in why, why


def test_counterfactual_text_statuses():
    assert counterfactual_text("Elle est tombée.", "M", "fr") == ("Il est tombé.", "ok", "ok")
    assert counterfactual_text(float("nan"), "M", "fr").status == "missing"
    assert counterfactual_text(None, "F", "en").status == "missing"


# ---- swap-text helpers --------------------------------------------------------------------------------------------

def test_swap_text():
    assert swap_text("Pt is a 45 yo M, his BP 150/90.", "en", "female") == "Pt is a 45 yo F, her BP 150/90."
    assert swap_text("Elle est connue pour HTA.", "fr", "male") == "Il est connu pour HTA."
    assert swap_text("Il est connu pour HTA.", "fr", "F") == "Elle est connue pour HTA."
    with pytest.raises(SexSpecificContent):
        swap_text("grossesse en cours", "fr", "male")
    with pytest.raises(ValueError, match="--to"):
        swap_text("he", "en", "x")


def test_swap_tsv(tmp_path):
    src = tmp_path / "in.tsv"
    pd.DataFrame({"id": ["a", "b", "c", "d"],
                  "hpi": ["He fell; his wife called.", "", "Hx of prostate ca.", "45M, temp 101F"]}).to_csv(src, sep="\t", index=False)
    out = swap_tsv(src, "hpi", "en", "female", tmp_path / "out" / "o.tsv")
    back = pd.read_csv(tmp_path / "out" / "o.tsv", sep="\t", dtype=str, keep_default_na=False)
    assert back["id"].tolist() == ["a", "b", "c", "d"]
    assert back["swap_status"].tolist() == ["ok", "missing", "excluded", "ok"]
    assert back["hpi"].tolist() == ["She fell; her wife called.", "", "", "45F, temp 101F"]
    assert "prostat" in back.loc[2, "swap_reason"]
    assert out["swap_status"].tolist() == back["swap_status"].tolist()
    with pytest.raises(KeyError, match="no column 'note'"):
        swap_tsv(src, "note", "en", "female", tmp_path / "x.tsv")


# ---- human review ---------------------------------------------------------------------------------------------------

def _pairs(n_f=300, n_m=200):
    n = n_f + n_m
    return pd.DataFrame({"record_id": [f"r{i:04d}" for i in range(n)], "orig_sex": ["F"] * n_f + ["M"] * n_m,
                         "original": [f"Elle est tombée {i}" for i in range(n)],
                         "rewritten": [f"Il est tombé {i}" for i in range(n)]})


def test_export_review_sample(tmp_path):
    pairs = _pairs(600, 400)
    s = export_review_sample(pairs, 500, 7, tmp_path / "review_fr.csv")
    assert len(s) == 500 and s["record_id"].is_unique
    assert s["orig_sex"].value_counts().to_dict() == {"F": 300, "M": 200}          # proportional strata
    assert list(s.columns[:2]) == ["review_id", "stratum"] and {"category", "comment"} <= set(s.columns)
    sheet = pd.read_csv(tmp_path / "review_fr.csv", dtype=str, keep_default_na=False)
    assert len(sheet) == 500 and (sheet["category"] == "").all()
    instr = (tmp_path / "review_fr_instructions.txt").read_text()
    assert all(c in instr for c in REVIEW_CATEGORIES) and "independently" in instr
    again = export_review_sample(pairs, 500, 7, tmp_path / "again.csv")
    assert again["record_id"].tolist() == s["record_id"].tolist()           # seeded
    other = export_review_sample(pairs, 500, 8, tmp_path / "other.csv")
    assert other["record_id"].tolist() != s["record_id"].tolist()
    with pytest.raises(ValueError, match="cannot sample"):
        export_review_sample(_pairs(10, 5), 250, 0, tmp_path / "x.csv")
    with pytest.raises(KeyError, match="lacks column"):
        export_review_sample(pairs.drop(columns="orig_sex"), 10, 0, tmp_path / "x.csv")


def test_review_agreement(tmp_path):
    s = export_review_sample(_pairs(), 250, 1, tmp_path / "review_en.csv")
    a = pd.read_csv(tmp_path / "review_en.csv", dtype=str, keep_default_na=False)
    b = a.copy()
    a["category"] = ["correct_complete"] * 240 + ["incomplete"] * 10
    b["category"] = ["correct_complete"] * 238 + ["incomplete"] * 12     # 2 disagreements, as in the paper's MIMIC review
    b = b.sample(frac=1, random_state=0)                                  # row order does not matter
    a.to_csv(tmp_path / "a.csv", index=False)
    b.to_csv(tmp_path / "b.csv", index=False)
    r = review_agreement(tmp_path / "a.csv", tmp_path / "b.csv")
    assert (r["n"], r["n_agree"], r["n_disagree"]) == (250, 248, 2)
    assert r["counts_a"] == {"correct_complete": 240, "incomplete": 10, "failed": 0}
    assert r["counts_b"] == {"correct_complete": 238, "incomplete": 12, "failed": 0}
    # kappa = (po - pe) / (1 - pe) computed by hand
    po = 248 / 250
    pe = (240 / 250) * (238 / 250) + (10 / 250) * (12 / 250)
    assert r["cohen_kappa"] == pytest.approx((po - pe) / (1 - pe))
    assert int(r["crosstab"].loc["correct_complete", "incomplete"]) == 2


def test_review_agreement_rejects_incomplete_sheets(tmp_path):
    export_review_sample(_pairs(20, 10), 10, 1, tmp_path / "r.csv")
    a = pd.read_csv(tmp_path / "r.csv", dtype=str, keep_default_na=False)
    b = a.copy()
    a["category"] = "correct_complete"
    b["category"] = ["correct_complete"] * 8 + ["", "wrong"]
    a.to_csv(tmp_path / "a.csv", index=False)
    b.to_csv(tmp_path / "b.csv", index=False)
    with pytest.raises(ValueError, match="2 empty or unknown"):
        review_agreement(tmp_path / "a.csv", tmp_path / "b.csv")
    b["category"] = "failed"
    b.iloc[:9].to_csv(tmp_path / "b.csv", index=False)
    with pytest.raises(ValueError, match="1 review_id"):
        review_agreement(tmp_path / "a.csv", tmp_path / "b.csv")


def test_lexicons_are_package_data():
    for lang in ("en", "fr"):
        lex = load_lexicon(lang)
        assert len(lex.rows) > 10 and lex.ctx
    assert load_lexicon("fr").swap("veuve", "adj", "M") == "veuf"


def test_review_sample_two_strata_and_all_agree(tmp_path):
    pairs = _pairs(60, 40).assign(level=[1, 2, 3, 4] * 25)
    s = export_review_sample(pairs, 20, 3, tmp_path / "r.csv", strata=("orig_sex", "level"))
    assert s.groupby(["orig_sex", "level"]).size().to_dict() == {("F", l): 3 for l in (1, 2, 3, 4)} | {("M", l): 2 for l in (1, 2, 3, 4)}
    a = pd.read_csv(tmp_path / "r.csv", dtype=str, keep_default_na=False)
    a["category"] = "correct_complete"
    a.to_csv(tmp_path / "a.csv", index=False)
    a.to_csv(tmp_path / "b.csv", index=False)
    r = review_agreement(tmp_path / "a.csv", tmp_path / "b.csv")
    assert r["n_agree"] == 20 and r["observed_agreement"] == 1.0
    assert r["cohen_kappa"] != r["cohen_kappa"]          # undefined (nan) when a single category is used by both


# ---- three error classes of g found by new users -------------------------------------------------------------
# Written from the rules (chapter 0_shared/04_rewrite, "Sex-specific content", "English rules", "French rules"), not from outputs.

# Appendix A terms match as whole words, each term with its forms listed explicitly (resources/sex_specific_forms_*.yaml)
MUST_EXCLUDE = [
    ("en", "s/p TAH for uterine fibroids", "uter"),
    ("en", "IUD (intrauterine device) placed 2019", "uter"),
    ("en", "Hx of ovarian cyst, now with RLQ pain", "ovar"),
    ("en", "Vaginal bleeding x2 days", "vagin"),
    ("en", "Testicular pain after kick", "testic"),
    ("en", "BPH with prostatitis", "prostat"),
    ("en", "Post-menopausal, on HRT", "menopaus"),
    ("en", "Pt is PREGNANT, 12 weeks", "pregnan"),
    ("en", "Prior C-section in 2015", "c-section"),
    ("en", "Followed by OB/GYN", "ob/gyn"),
    ("en", "Hx of gynecomastia on spironolactone", "gyneco"),
    ("en", "Mother of 3, miscarried last year", "miscarr"),
    ("fr", "Antécédent d'hystérectomie", "hystérectomie"),
    ("fr", "Aménorrhée depuis 2 mois", "ménorrhée"),
    ("fr", "Douleur testiculaire droite", "testicul"),
    ("fr", "Suivi en gynécologie", "gyné"),
    ("fr", "IVG en 2018", "ivg"),
    ("fr", "K du sein traité en 2010", "k sein"),
    ("fr", "Trompe de Fallope", "fallope"),
    ("fr", "Patiente ménopausée", "menopause"),
    ("fr", "Grossesse extra-utérine", "grossesse"),
    ("fr", "Douleur de l'utérus", "utér"),
    ("fr", "Pas de règles depuis 2 mois", "règles"),
]
MUST_NOT_EXCLUDE = [
    ("en", "Outer ear pain, computer worker"),                 # uter inside unrelated words
    ("en", "Cesare Rossi, 45M, fell at home"),                 # a first name holding cesare
    ("en", "Bowel invagination on CT"),                        # vagin inside invagination
    ("en", "Deuterium oxide study, neutered dog bite"),
    ("en", "Takes Novartis trial drug"),                       # ovar inside a company/drug name
    ("en", "Router fell on her foot"),
    ("en", "Hx of dissemination of infection"),
    ("en", "OB negative stool guaiac"),                        # OB = occult blood, not ob/gyn
    ("fr", "A voulu chuter de sa chaise"),                     # uter inside chuter
    ("fr", "Invagination intestinale aiguë"),                  # vagin inside invagination
    ("fr", "Allergie à la penicilline"),                       # peni inside a drug name without its accent
    ("fr", "Allergie à la pénicilline et à la penicillamine"),
    ("fr", "Difficultés pour exécuter les ordres simples"),    # uter inside exécuter
    ("fr", "Règles hygiéno-diététiques expliquées"),           # rules, not periods
    ("fr", "Souhaite discuter du traitement"),                 # uter inside discuter
    ("fr", "Percuté par une voiture, a chuté"),
    ("fr", "Kiné pour lombalgie, prend du Spasfon"),
    ("fr", "Syndrome de Ménière connu"),                       # an eponym
]


@pytest.mark.parametrize("lang,text,term", MUST_EXCLUDE)
def test_sex_specific_forms_exclude(lang, text, term):
    from triage_cf.rewrite import sex_specific_match
    assert sex_specific_match(text, lang) == term
    assert counterfactual_text(text, "F", lang).status == "excluded"


@pytest.mark.parametrize("lang,text", MUST_NOT_EXCLUDE)
def test_stems_inside_unrelated_words_do_not_exclude(lang, text):
    assert not is_sex_specific(text, lang)
    assert counterfactual_text(text, "M", lang).status == "ok"


def test_every_appendix_term_has_forms(tmp_path, monkeypatch):
    from triage_cf import rewrite
    for lang in ("en", "fr"):
        forms, _ = rewrite.sex_specific_forms(lang)
        assert set(forms) == set(rewrite.sex_specific_terms(lang))
        plain = lambda w: "".join(c for c in unicodedata.normalize("NFD", w) if not unicodedata.combining(c)).replace("ae", "e")
        for term, fs in forms.items():        # every form of a one-word stem holds the stem (accents, ae/e aside)
            if " " not in term and "/" not in term and "-" not in term:
                stem = plain(term)[:max(4, len(term) - 2)]
                assert all(stem in plain(f) for f in fs), (term, fs)


# his/her/hers: the role needs the following token, in both directions
EN_ROLE_CASES = [
    ("F", "He landed on his back.", "She landed on her back."),
    ("F", "He hurt his back lifting boxes.", "She hurt her back lifting boxes."),
    ("M", "She hurt her back lifting boxes.", "He hurt his back lifting boxes."),
    ("M", "Her back hurts.", "His back hurts."),
    ("F", "He lay on his back all night.", "She lay on her back all night."),
    ("M", "She rolled onto her back.", "He rolled onto his back."),
    ("F", "Pain down his back.", "Pain down her back."),
    ("M", "Found her on her back.", "Found him on his back."),
    ("M", "Daughter brought her back to the ED.", "Daughter brought him back to the ED."),
    ("M", "Called her back with results.", "Called him back with results."),
    ("M", "She put her back out lifting.", "He put his back out lifting."),
    ("M", "Gave her back the phone.", "Gave him back the phone."),
    ("F", "He wants his back.", "She wants hers back."),
    ("M", "Her last dose was at 8 am.", "His last dose was at 8 am."),
    ("F", "His last dose was at 8 am.", "Her last dose was at 8 am."),
    ("M", "PCP saw her last week.", "PCP saw him last week."),
    ("M", "At her last visit she was stable.", "At his last visit he was stable."),
    ("M", "Her only child lives nearby.", "His only child lives nearby."),
    ("M", "Daughter sees her only once a week.", "Daughter sees him only once a week."),
    ("F", "His very first seizure.", "Her very first seizure."),
    ("M", "Her very first seizure.", "His very first seizure."),
    ("F", "His every move hurts.", "Her every move hurts."),
    ("M", "Husband sees her every day.", "Husband sees him every day."),
    ("F", "His next dose is due at 6.", "Her next dose is due at 6."),
    ("F", "The phone is his and the bag is his too.", "The phone is hers and the bag is hers too."),
    ("F", "His is the blue bag.", "Hers is the blue bag."),
    ("F", "His right knee is swollen, his is worse than before.", "Her right knee is swollen, hers is worse than before."),
    ("M", "The blue bag is hers.", "The blue bag is his."),
    ("M", "She hit her head on her way down.", "He hit his head on his way down."),
]


@pytest.mark.parametrize("target,text,expected", EN_ROLE_CASES)
def test_his_her_role_from_the_following_token(target, text, expected):
    assert g(text, target, "en") == expected
    assert validate_rewrite(text, expected, "en") == (True, "ok")


# French agreement across a verb or at a distance; attributes of other people stay
FR_AGREEMENT_CASES = [
    ("M", "Mme Dupont a été vue par le médecin.", "M. Dupont a été vu par le médecin."),
    ("F", "Il a été vu par le médecin.", "Elle a été vue par le médecin."),
    ("M", "Elle a été prise en charge par le SAMU.", "Il a été pris en charge par le SAMU."),
    ("M", "Elle a été admise en réanimation.", "Il a été admis en réanimation."),
    ("F", "Il est sorti hier.", "Elle est sortie hier."),
    ("M", "Elle est allée chez son médecin.", "Il est allé chez son médecin."),
    ("M", "Elle était déshydratée.", "Il était déshydraté."),
    ("F", "Il était très déshydraté.", "Elle était très déshydratée."),
    ("M", "Sa fille l'a vue hier.", "Sa fille l'a vu hier."),
    ("M", "Madame X retrouvée au sol par son voisin.", "Monsieur X retrouvé au sol par son voisin."),
    ("F", "Monsieur Durand retrouvé au sol par son voisin.", "Madame Durand retrouvée au sol par son voisin."),
    ("M", "Hier, retrouvée au sol par son voisin, la patiente est confuse.",
     "Hier, retrouvé au sol par son voisin, le patient est confus."),
    ("F", "Ce matin, retrouvé au sol par sa voisine, il est confus.", "Ce matin, retrouvée au sol par sa voisine, elle est confuse."),
    ("M", "Après avoir été retrouvée au sol, elle est amenée.", "Après avoir été retrouvé au sol, il est amené."),
    ("F", "Après avoir été vu par son médecin, il est adressé.", "Après avoir été vue par son médecin, elle est adressée."),
    ("M", "Elle a été réveillée par son mari, inquiet.", "Il a été réveillé par son mari, inquiet."),
    ("M", "Elle a été vue par l'infirmier, qui est inquiet.", "Il a été vu par l'infirmier, qui est inquiet."),
    ("F", "L'infirmier est fatigué, le patient est agité.", "L'infirmier est fatigué, la patiente est agitée."),
    ("F", "Son voisin a été blessé, il est choqué.", "Son voisin a été blessé, elle est choquée."),
    ("F", "Il a été retrouvé par son voisin, qui est resté avec lui.", "Elle a été retrouvée par son voisin, qui est resté avec elle."),
    ("M", "Prise en charge antalgique. Sortie prévue demain.", "Prise en charge antalgique. Sortie prévue demain."),
    ("F", "Prise de sang faite, il est rassuré.", "Prise de sang faite, elle est rassurée."),
    ("M", "Elle est en bonne santé, pas de fièvre depuis une année.", "Il est en bonne santé, pas de fièvre depuis une année."),
    ("F", "Il a été transféré puis opéré.", "Elle a été transférée puis opérée."),
    ("F", "Il a été décidé d'hospitaliser.", "Il a été décidé d'hospitaliser."),
    ("M", "Sa fille, qui l'a trouvée au sol, est inquiète.", "Sa fille, qui l'a trouvé au sol, est inquiète."),
    ("F", "Il est atteint d'une BPCO. Atteinte pulmonaire bilatérale.", "Elle est atteinte d'une BPCO. Atteinte pulmonaire bilatérale."),
    ("M", "Elle est mise sous O2. La mise en place d'une VVP.", "Il est mis sous O2. La mise en place d'une VVP."),
]


@pytest.mark.parametrize("target,text,expected", FR_AGREEMENT_CASES)
def test_french_agreement_across_a_verb_or_at_a_distance(target, text, expected):
    assert g(text, target, "fr") == expected
    assert counterfactual_text(text, target, "fr") == (expected, "ok", "ok")


def test_issue16_case_counts():
    assert len(MUST_EXCLUDE) + len(MUST_NOT_EXCLUDE) >= 20 and len(MUST_NOT_EXCLUDE) >= 10 and len(MUST_EXCLUDE) >= 10
    assert len(EN_ROLE_CASES) >= 20 and len(FR_AGREEMENT_CASES) >= 20
