"""benchmarks/localised_bias.py: what one audit decided (the planted category flagged with the oracle's sign, flags in
the others) and the pooled rates, on hand-made audit records; and the committed results file's shape."""
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import localised_bias as lb   # noqa: E402


def _row(cat, est, finding, p=0.01, null_median=0.0):
    return dict(category=cat, n_pairs=300, estimate=est, ci=[est - 0.05, est + 0.05], null_median=null_median, p=p,
                q=p, mde=0.05, finding=finding, test="predictive t, 8 df")


def _audit(key, rf, oracle_cp=0.8, fit=True):
    return dict(key=key, dataset="synth-en", seed=1, n_records=12000, fit_for_audit=fit, planted_category="chest pain",
                category_share=0.12, rf=rf, oracle=[_row("chest pain", oracle_cp, None), _row("trauma", 0.0, None)])


def test_audit_summary_needs_the_flag_and_the_oracles_sign():
    ok = lb.audit_summary(_audit("a", [_row("chest pain", 0.15, True), _row("trauma", 0.01, False), _row("gi", 0.2, True)]))
    assert ok["planted_flagged"] and ok["other_tested"] == 2 and ok["other_flagged"] == 1 and ok["other_flagged_names"] == ["gi"]
    wrong_sign = lb.audit_summary(_audit("b", [_row("chest pain", -0.15, True)]))
    assert not wrong_sign["planted_flagged"]
    not_flagged = lb.audit_summary(_audit("c", [_row("chest pain", 0.15, False), _row("neuro", 0.0, None, p=None)]))
    assert not not_flagged["planted_flagged"] and not_flagged["other_tested"] == 0   # an untested category is not counted


def test_summarise_pools_the_fit_audits_only():
    audits = [_audit("a", [_row("chest pain", 0.15, True), _row("trauma", 0.0, False)]),
              _audit("b", [_row("chest pain", 0.15, False), _row("trauma", 0.3, True)]),
              _audit("c", [_row("chest pain", 0.15, True)], fit=False)]
    s = lb.summarise(audits)
    assert (s["n_audits"], s["n_fit"]) == (3, 2)
    assert (s["recovery"]["k"], s["recovery"]["n"]) == (1, 2)
    assert (s["other_false_flags"]["k"], s["other_false_flags"]["n"]) == (1, 2)
    assert s["size_choice"][0]["mde_curve_at_category_size"] > 0


def test_the_committed_results_are_what_summarise_makes_of_their_records():
    res = json.loads((REPO / "benchmarks" / "results" / "localised_bias.json").read_text())
    again = lb.summarise(res["audit_records"])
    for k in ("n_audits", "n_fit", "recovery", "other_false_flags", "audits_with_a_false_flag"):
        assert again[k] == res[k], k
