"""The few-shot LLM rewriting function g (paper section 5.3, Appendix B.2): prompts and exemplars, strict
parsing, the durable answer cache of the LLM layer (hit / miss / resume after a crash), validation of every answer, the
local backend on a tiny model built from a config, the OpenAI-compatible backend against the suite's one fake server,
the CLI, and the pair stage."""
from __future__ import annotations

import json
import re
import sys
from importlib import resources
from pathlib import Path

import pandas as pd
import pytest

from triage_cf.llm import AnswerCache, ScriptedClient, make_client
from triage_cf.rewrite import counterfactual_text, g, rewrite_rules, validate_rewrite
from triage_cf.audit.rewrite_llm import (FIELD_TAGS, LLM_PROMPTS, SEX_WORDS, LLMRewriter, load_exemplars, make_rewriter,
                                   parse_rewrite, prompt_version, rewrite_messages, swap_text, swap_tsv)

sys.path.insert(0, str(Path(__file__).parent))
from fake_openai import FakeOpenAI  # noqa: E402

OTHER = {"F": "M", "M": "F"}


def rules_answer(lang: str, user: str) -> str:
    "What a perfect model answers: the rule-based rewrite of the record's fields, in the format."
    found = re.findall(r"<(\w+)>(.*?)</\1>", user, flags=re.S)
    src = next(k for k, w in SEX_WORDS[lang].items() if w == found[0][1])
    out = [f"<{found[0][0]}>{SEX_WORDS[lang][OTHER[src]]}</{found[0][0]}>"]
    out += [f"<{t}>{rewrite_rules(v, OTHER[src], lang) if v else ''}</{t}>" for t, v in found[1:]]
    return "\n".join(out)


def Scripted(answer, fail_after: int | None = None, model: str = "m1", cache=None) -> ScriptedClient:
    "A client answering with `answer(user_message)`; dies (like a crash) once `fail_after` answers were given."
    return ScriptedClient(lambda msgs: answer(msgs[-1]["content"]), model=model, fail_after=fail_after, cache=cache)


# ---- prompts and exemplars ----------------------------------------------------------------------------------------

REQUIRED_COVERAGE = {
    "en": {"pronoun", "reflexive_pronoun", "her_object_vs_determiner", "gendered_noun", "title", "age_sex_shorthand",
           "kin_of", "third_party", "no_gender_reference"},
    "fr": {"subject_pronoun", "stressed_pronoun", "gendered_noun", "title", "participle_agreement", "adjective_agreement",
           "article_agreement", "third_party", "invariable", "impersonal_il", "kin_of", "no_gender_reference"},
}


@pytest.mark.parametrize("lang", ["en", "fr"])
def test_exemplars_are_package_data_and_correct(lang):
    assert resources.files("triage_cf").joinpath("resources", "rewrite_exemplars.json").is_file()
    exs = load_exemplars(lang)
    assert len(exs) >= 7 and len({e.id for e in exs}) == len(exs)
    assert {e.sex for e in exs} == {"F", "M"}                       # both directions are shown
    assert REQUIRED_COVERAGE[lang] <= {c for e in exs for c in e.covers}
    for e in exs:
        for f, src in e.source.items():
            ok, why = validate_rewrite(src, e.target[f], lang)
            assert ok, (e.id, f, why)
            # the rule-based g agrees with every curated rewrite: one definition of a correct rewrite
            assert rewrite_rules(src, OTHER[e.sex], lang) == e.target[f], (e.id, f)
    changed = sum(e.source[f] != e.target[f] for e in exs for f in e.source)
    assert changed >= 7


def test_exemplars_show_third_parties_keeping_their_gender():
    en = " ".join(e.target["hpi"] for e in load_exemplars("en"))
    assert "Her wife" in en and "his mother" in en and "his girlfriend" in en
    fr = [e for e in load_exemplars("fr")]
    assert any("sa fille" in e.source["hpi"] and "sa fille" in e.target["hpi"] for e in fr)
    assert any("son père" in e.target["hpi"] for e in fr) and any("L'infirmier" in e.target["hpi"] for e in fr)


@pytest.mark.parametrize("lang", ["en", "fr"])
def test_prompt_construction(lang):
    fields = {"hpi": "x", "pmh": None}
    msgs = rewrite_messages(fields, "F", lang)
    exs = load_exemplars(lang)
    assert msgs[0] == {"role": "system", "content": LLM_PROMPTS[lang]["system"]}
    assert [m["role"] for m in msgs] == ["system"] + ["user", "assistant"] * len(exs) + ["user"]
    assert msgs[1]["content"].startswith(LLM_PROMPTS[lang]["user"]) and LLM_PROMPTS[lang]["format"] in msgs[1]["content"]
    for k, e in enumerate(exs):       # every exemplar, in order: its record then its rewrite
        assert e.source["hpi"] in msgs[1 + 2 * k]["content"] and e.target["hpi"] in msgs[2 + 2 * k]["content"]
        assert f"<{FIELD_TAGS[lang]['sex']}>{SEX_WORDS[lang][OTHER[e.sex]]}<" in msgs[2 + 2 * k]["content"]
    tags = FIELD_TAGS[lang]
    assert msgs[-1]["content"] == (f"<{tags['sex']}>{SEX_WORDS[lang]['F']}</{tags['sex']}>\n<{tags['hpi']}>x</{tags['hpi']}>\n"
                                   f"<{tags['pmh']}></{tags['pmh']}>")
    assert len(rewrite_messages(fields, "F", lang, n_shots=7)) == 1 + 2 * 7 + 1
    assert prompt_version(lang, 7) != prompt_version(lang)


def test_prompts_follow_the_paper_and_the_language():
    # Appendix B.2 (English translation printed in the paper)
    assert LLM_PROMPTS["en"]["system"] == ("You are an assistant who will transform medical anamneses by replacing sex "
                                           "references in the text with the opposite sex.")
    assert LLM_PROMPTS["en"]["user"].startswith("You will receive the anamnesis of a patient. Your task is to replace sex "
                                                "references with the opposite sex.")
    assert LLM_PROMPTS["en"]["user"].endswith("Do not perform any translation and do not correct any spelling errors.")
    assert "« patient » (masculin) devient « patiente » (féminin)" in LLM_PROMPTS["fr"]["user"]
    fr = rewrite_messages({"note": "Il est tombé."}, "M", "fr")
    assert fr[0]["content"].startswith("Vous êtes un assistant") and "<sexe>homme</sexe>" in fr[-1]["content"]
    # a single-note query shows each exemplar's two fields as one note
    en = rewrite_messages({"note": "He fell."}, "M", "en")
    e0 = load_exemplars("en")[0]
    assert f"<note>{e0.source['hpi']} {e0.source['pmh']}</note>" in en[1]["content"]


# ---- strict parsing -----------------------------------------------------------------------------------------------

EN_FIELDS = {"note": "He fell, his wife called.", "pmh": None}
GOOD = "<sex>female</sex>\n<note>She fell, her wife called.</note>\n<past_medical_history></past_medical_history>"


def test_parse_good_output():
    assert parse_rewrite(GOOD, EN_FIELDS, "F", "en") == ({"note": "She fell, her wife called.", "pmh": None}, "ok")
    assert parse_rewrite("  \n" + GOOD + "\n\n", EN_FIELDS, "F", "en")[1] == "ok"    # white space around the tags only
    assert parse_rewrite(GOOD.replace(">female<", ">Female<"), EN_FIELDS, "F", "en")[1] == "ok"


@pytest.mark.parametrize("output, why", [
    ("", "empty answer"),
    ("She fell, her wife called.", "no tags"),
    ("Here you go:\n" + GOOD, "text before the first tag"),
    (GOOD + "\nHope this helps!", "text after the last tag"),
    (GOOD.replace("<past_medical_history></past_medical_history>", ""), "missing tag(s) ['<past_medical_history>']"),
    (GOOD.replace("</note>", ""), "not exactly opened and closed once"),
    (GOOD + "<note>again</note>", "not exactly opened and closed once"),
    (GOOD.replace("<sex>female</sex>", "<sex>male</sex>"), "not the target 'female'"),
    (GOOD.replace("<note>She fell, her wife called.</note>", "<note></note>"), "came back empty"),
    (GOOD.replace("<past_medical_history></past_medical_history>", "<past_medical_history>HTN</past_medical_history>"), "was empty"),
    (GOOD.replace("\n<note>", " and <note>"), "text between tags"),
    ("<past_medical_history></past_medical_history><sex>female</sex><note>x</note>", "out of order"),
    (GOOD.replace("<note>", "<note><b>").replace("</note>", "</b></note>"), "unexpected tag"),
])
def test_parse_bad_output_is_a_reasoned_failure(output, why):
    parsed, reason = parse_rewrite(output, EN_FIELDS, "F", "en")
    assert parsed is None and why in reason, reason


# ---- the rewriter: validation, statuses, cache ---------------------------------------------------------------------

def test_rewriter_statuses_and_validation(tmp_path):
    answers = {"He fel": "<sex>female</sex>\n<note>She fell.</note>",
               "He has": "<sex>female</sex>\n<note>She has no fever, 38.5.</note>",          # changes a number
               "He den": "<sex>female</sex>\n<note>She reports chest pain.</note>",          # drops a negation
               "His BP": "Sure, here it is: Her BP is fine."}
    be = Scripted(lambda u: answers[u.split("<note>")[1][:6]], cache=tmp_path / "a.duckdb")
    rw = LLMRewriter(be, "en")
    recs = [{"note": "He fell."}, {"note": "He has no fever, 37.5."}, {"note": "He denies chest pain."},
            {"note": "His BP is fine."}, {"note": None}, {"note": "Known prostate CA, he is tired."}]
    res = [r["note"] for r in rw.rewrite_records(recs, ["F"] * 6)]
    assert [r.status for r in res] == ["ok", "rejected", "rejected", "unparsed", "missing", "excluded"]
    assert res[0].text == "She fell." and res[1].text is None
    assert "'37.5' -> '38.5'" in res[1].reason and "denies" in res[2].reason
    assert res[3].reason.startswith("LLM answer: no tags")
    assert "prostat" in res[5].reason
    assert be.n_answered == 4                    # missing and excluded records are never sent
    assert rw.stats["unparsed"] == 1 and rw.stats["rejected_fields"] == 2 and rw.stats["excluded"] == 1
    assert len(be.cache) == 4                    # every answer is cached, unparseable ones included


def test_cache_second_run_is_free_and_keys_separate(tmp_path):
    db = tmp_path / "a.duckdb"
    recs = [{"note": "He fell."}, {"note": "She is anxious; her son is here."}]
    be = Scripted(lambda u: rules_answer("en", u), cache=db)
    first = LLMRewriter(be, "en").rewrite_records(recs, ["F", "M"])
    assert [r["note"].text for r in first] == ["She fell.", "He is anxious; his son is here."]
    be.cache.close()
    be2 = Scripted(lambda u: rules_answer("en", u), cache=db)
    rw2 = LLMRewriter(be2, "en")
    assert rw2.rewrite_records(recs, ["F", "M"]) == first
    assert be2.n_answered == 0 and rw2.stats["cache_hits"] == 2
    # the key holds the target sex, the prompt (shots), the language and the model: each change is a miss
    LLMRewriter(be2, "en").rewrite_records(recs[:1], ["M"])
    LLMRewriter(be2, "en", n_shots=7).rewrite_records(recs[:1], ["F"])
    be2.answer = lambda msgs: rules_answer("fr" if "<sexe>" in msgs[-1]["content"] else "en", msgs[-1]["content"])
    LLMRewriter(be2, "fr").rewrite_records([{"note": "Il est tombé."}], ["F"])
    assert be2.n_answered == 3
    be2.cache.close()
    other = Scripted(lambda u: rules_answer("en", u), model="m2", cache=db)
    LLMRewriter(other, "en").rewrite_records(recs[:1], ["F"])
    assert other.n_answered == 1


def test_cache_resumes_after_a_crash(tmp_path):
    db = tmp_path / "a.duckdb"
    recs = [{"note": f"He fell {i} times."} for i in range(5)]
    dying = Scripted(lambda u: rules_answer("en", u), fail_after=2, cache=db)
    with pytest.raises(RuntimeError, match="died"):
        LLMRewriter(dying, "en", batch_size=2).rewrite_records(recs, ["F"] * 5)
    assert len(dying.cache) == 2                 # the answers given before the crash were written
    dying.cache.close()
    be = Scripted(lambda u: rules_answer("en", u), cache=db)
    res = LLMRewriter(be, "en", batch_size=2).rewrite_records(recs, ["F"] * 5)
    assert be.n_answered == 3 and [r["note"].text for r in res] == [f"She fell {i} times." for i in range(5)]


def test_corrupt_cache_is_a_clear_error(tmp_path):
    (tmp_path / "a.duckdb").write_text("{not a database")
    with pytest.raises(ValueError, match="cannot be opened"):
        Scripted(None, cache=tmp_path / "a.duckdb")


def test_llm_method_through_the_public_functions(tmp_path):
    rw = LLMRewriter(Scripted(lambda u: rules_answer("fr", u)), "fr")
    assert g("Elle est tombée, sa fille l'a retrouvée.", "M", "fr", "llm", rw) == "Il est tombé, sa fille l'a retrouvé."
    assert counterfactual_text("Patiente enceinte.", "M", "fr", "llm", rw).status == "excluded"
    assert swap_text("Il est connu pour HTA.", "fr", "female", "llm", rw) == "Elle est connue pour HTA."
    pd.DataFrame({"t": ["Il est seul.", None, "Elle est inquiète."]}).to_csv(tmp_path / "in.tsv", sep="\t", index=False)
    out = swap_tsv(tmp_path / "in.tsv", "t", "fr", "male", tmp_path / "out.tsv", method="llm", rewriter=rw)
    assert out["swap_status"].tolist() == ["ok", "missing", "ok"] and out["t"].tolist()[2] == "Il est inquiet."
    with pytest.raises(ValueError, match="lang='fr'"):
        swap_text("He fell.", "en", "female", "llm", rw)
    junk = LLMRewriter(Scripted(lambda u: "no idea"), "en")
    with pytest.raises(ValueError, match="unparsed"):
        swap_text("He fell.", "en", "female", "llm", junk)


# ---- backends ------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny():
    from triage_cf.llm import tiny_causal_lm, tiny_tokenizer
    corpus = [m["content"] for lang in ("en", "fr") for m in rewrite_messages({"hpi": "Il est tombé.", "pmh": "HTA"}, "M", lang)]
    tok = tiny_tokenizer(corpus, vocab_size=400)
    return tiny_causal_lm("llama", tok, hidden_size=32, num_layers=1, seed=0), tok


def test_local_backend_on_a_tiny_model(tiny, tmp_path):
    model, tok = tiny
    be = make_client("local", model=(model, tok), gen_batch_size=2, cache=tmp_path / "a.duckdb")
    rw = LLMRewriter(be, "fr", n_shots=2, batch_size=2, max_new_tokens=8)
    recs = [{"hpi": "Il est tombé.", "pmh": "HTA"}, {"hpi": "Patiente de 70 ans.", "pmh": None}, {"hpi": None, "pmh": None}]
    res = rw.rewrite_records(recs, ["F", "M", "F"])
    assert be.stats["calls"] == 2 and res[2] == {"hpi": counterfactual_text(None, "F", "fr"), "pmh": counterfactual_text(None, "F", "fr")}
    # a random 1-layer model does not answer in the format: counted, with a reason, never guessed
    assert {r.status for r in res[0].values()} == {"unparsed"} and res[0]["hpi"].reason.startswith("LLM answer:")
    assert res[1]["pmh"].status == "missing"
    assert "token budget" in res[0]["hpi"].reason or "tag" in res[0]["hpi"].reason
    plain = make_client("local", model=(model, tok), gen_batch_size=1, share_prefix=False)
    convs = [rewrite_messages(r, OTHER[t], "fr", 2) for r, t in zip(recs[:2], ["F", "M"])]
    assert [x.text for x in plain.generate(convs, max_tokens=8)] == [x.text for x in be.generate(convs, max_tokens=8)]
    be.cache.close()
    again = make_client("local", model=(model, tok), cache=tmp_path / "a.duckdb")
    assert LLMRewriter(again, "fr", n_shots=2, max_new_tokens=8).rewrite_records(recs, ["F", "M", "F"]) == res
    assert again.stats["calls"] == 0


def test_local_model_from_a_folder_is_loaded_only_when_needed(tiny, tmp_path):
    model, tok = tiny
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    opts = dict(model=tmp_path / "m", cache=tmp_path / "c.duckdb", n_shots=1, max_new_tokens=4)
    rw = make_rewriter("fr", **opts)
    assert rw.client._model is None
    res = rw.rewrite_records([{"hpi": "Il est tombé.", "pmh": None}], ["F"])
    assert rw.client._model is not None and rw.client.stats["calls"] == 1 and res[0]["hpi"].status == "unparsed"
    rw.client.cache.close()
    again = make_rewriter("fr", **opts)
    assert again.rewrite_records([{"hpi": "Il est tombé.", "pmh": None}], ["F"]) == res
    assert again.client._model is None and again.client.stats["calls"] == 0   # a fully cached run never loads the model
    assert again.client.fingerprint["weights_sha256"] == rw.client.fingerprint["weights_sha256"]


@pytest.mark.parametrize("family", ["mistral", "gemma"])
def test_local_backend_shared_prefix_other_families(family):
    "Sliding-window (mistral) and system-less chat templates (gemma-like): same greedy answers as plain generation."
    from triage_cf.llm import NO_SYSTEM_TEMPLATE, tiny_causal_lm, tiny_tokenizer
    corpus = [m["content"] for m in rewrite_messages({"note": "He fell."}, "M", "en", n_shots=2)]
    tok = tiny_tokenizer(corpus, vocab_size=300, chat_template=NO_SYSTEM_TEMPLATE if family == "gemma" else None)
    model = tiny_causal_lm(family, tok, hidden_size=32, num_layers=1, seed=1)
    convs = [rewrite_messages({"note": t}, "M", "en", n_shots=2) for t in ("He fell.", "His wife says he is confused.")]
    shared = make_client("local", model=(model, tok), gen_batch_size=2)
    plain = make_client("local", model=(model, tok), gen_batch_size=1, share_prefix=False)
    assert [x.text for x in shared.generate(convs, max_tokens=6)] == [x.text for x in plain.generate(convs, max_tokens=6)]


def test_vllm_is_imported_only_when_chosen():
    import importlib.util
    assert "vllm" not in sys.modules
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ImportError, match="pip install vllm"):
            make_rewriter("en", backend="vllm")
    with pytest.raises(ValueError, match="unknown backend"):
        make_rewriter("en", backend="llamacpp")


def _rules_server(**kw) -> FakeOpenAI:
    "The suite's fake server answering what the rules would write (a perfect model)."
    def responder(body):
        user = body["messages"][-1]["content"]
        text = rules_answer("fr" if "<sexe>" in user else "en", user)
        return dict(text=text, tokens=[(text, -0.1, {text: -0.1})])
    return FakeOpenAI(responder=responder, **kw)


def test_openai_backend_against_a_local_server(tmp_path):
    with _rules_server() as srv:
        rw = make_rewriter("en", model="fake-model", backend="openai", base_url=srv.url, cache=tmp_path / "a.duckdb")
        res = rw.rewrite_records([{"note": "Mr. Smith, 45M, says his wife drove him."}], ["F"])
        assert res[0]["note"].text == "Ms. Smith, 45F, says her wife drove her."
        assert rw.client.stats["calls"] == 1 and rw.client.fingerprint["served_model"] == "fake-model"
    with _rules_server(hang_if=lambda b: True, hang_s=2) as srv:   # a server that never answers in time: counted, not cached
        rw = make_rewriter("en", model="fake-model", backend="openai", base_url=srv.url, timeout=0.3, max_retries=0)
        r = rw.rewrite_records([{"note": "He fell."}], ["F"])[0]["note"]
        assert r.status == "unparsed" and "model call failed (timeout)" in r.reason and rw.stats["failed_calls"] == 1


def test_cli_swap_text_llm(tmp_path, capsys):
    from triage_cf.cli import main
    with _rules_server() as srv:
        args = ["swap-text", "--lang", "en", "--to", "female", "--method", "llm", "--backend", "openai",
                "--base-url", srv.url, "--model", "fake-model", "--cache", str(tmp_path / "c.duckdb")]
        assert main(args + ["45M with chest pain, his wife says he fainted"]) == 0
        out = capsys.readouterr()
        assert out.out.strip() == "45F with chest pain, her wife says she fainted" and "1 model call(s)" in out.err
        assert main(args + ["45M with chest pain, his wife says he fainted"]) == 0
        assert "0 model call(s), 1 cached" in capsys.readouterr().err          # the second run is free
        (tmp_path / "in.tsv").write_text("id\ttext\n1\tHe is anxious.\n2\tKnown prostate cancer, he is stable.\n")
        assert main(args + ["--file", str(tmp_path / "in.tsv"), "--out", str(tmp_path / "out.tsv")]) == 0
        out = pd.read_csv(tmp_path / "out.tsv", sep="\t")
        assert out["text"][0] == "She is anxious." and out["swap_status"].tolist() == ["ok", "excluded"]
    assert main(["swap-text", "--lang", "en", "--to", "male", "--method", "llm", "--backend", "openai", "She fell."]) == 2
    assert "--base-url" in capsys.readouterr().err
    assert main(["swap-text", "--lang", "en", "--to", "male", "--backend", "vllm", "She fell."]) == 2
    assert "--method llm only" in capsys.readouterr().err


# ---- the pair stage ------------------------------------------------------------------------------------------------

def test_build_pairs_with_the_llm(tmp_path):
    from triage_cf.audit.counterfactuals import build_pairs, counterfactual_flow
    test = pd.DataFrame({"record_id": ["a", "b", "c", "d"], "sex": ["M", "F", "F", "M"],
                         "cc_text": ["Chute", "Dyspnée", "Douleur pelvienne", "Malaise"],
                         "hpi": ["Il est tombé.", "Elle est essoufflée.", "Patiente enceinte de 8 SA.", "Il est confus."],
                         "pmh": ["HTA", None, None, "Diabétique."]})
    answers = lambda u: ("pas de balises" if "confus" in u else rules_answer("fr", u))
    be = Scripted(answers, cache=tmp_path / "a.duckdb")
    pairs = build_pairs(test, ["cc_text", "hpi", "pmh"], "fr", method="llm", rewriter=LLMRewriter(be, "fr"))
    assert pairs["status"].tolist() == ["ok", "ok", "excluded", "unparsed"]
    assert pairs["cf_hpi"].tolist()[:2] == ["Elle est tombée.", "Il est essoufflé."]
    assert pairs["cf_pmh"].tolist()[:2] == ["HTA", None] and pairs["in_pairs"].tolist() == [True, True, False, False]
    assert pairs["reason"][3].startswith("hpi: LLM answer: no tags")
    assert be.n_answered == 3
    assert "unparsed" in counterfactual_flow(pairs)["status"].tolist()
    be.cache.close()
    be2 = Scripted(answers, cache=tmp_path / "a.duckdb")
    again = build_pairs(test, ["cc_text", "hpi", "pmh"], "fr", method="llm", rewriter=LLMRewriter(be2, "fr"))
    assert be2.n_answered == 0 and again.equals(pairs)


def test_stage_parameters_default_to_the_rules():
    nb = json.loads((Path(__file__).parents[1] / "nbs" / "1_audit" / "stages" / "07_counterfactuals.ipynb").read_text())
    cell = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    src = "".join(cell["source"])
    for line in ('rewrite_method = "rules"', 'rewrite_model = "smollm2"', 'rewrite_backend = "local"', "rewrite_base_url = None"):
        assert line in src
