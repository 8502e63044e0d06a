"""The reconciliation of the paper's published numbers: the verdicts the notebook prints, asserted."""
import pandas as pd
import pytest

from triage_cf.audit import reconcile as R


@pytest.fixture(scope="module")
def book():
    numbers, checks = R.build_checks()
    return numbers, checks, R.number_verdicts(numbers, checks).set_index("id")


def verdict(book, nid):
    return book[2].loc[nid, "verdict"]


def test_every_number_has_a_known_verdict(book):
    numbers, checks, v = book
    assert len(v) == len(numbers) and set(v.verdict) <= set(R.RECONCILIATION_VERDICTS)
    assert set(checks.target) <= set(numbers.id)


def test_rounding_tolerance_follows_printed_precision():
    assert R.rounding_interval("28.16")[1:] == pytest.approx((28.155, 28.165))
    assert R.rounding_interval("0.0086")[1:] == pytest.approx((0.00855, 0.00865))
    assert R.rounding_interval("220000")[1:] == pytest.approx((215000, 225000))
    assert R.rounding_interval("1.63e6")[1:] == pytest.approx((1.625e6, 1.635e6))


@pytest.mark.parametrize("level", [3, 4, 5])
def test_table7_or_and_ci_reproduced(book, level):
    for k in ("OR", "ci_low", "ci_high"):
        assert verdict(book, f"Table 7|{level}|{k}") == "reproduced"


def test_table7_p_values(book):
    assert verdict(book, "Table 7|3|p") == "reproduced"        # < 1e-15
    assert verdict(book, "Table 7|5|p") == "reproduced"        # 0.0086
    assert verdict(book, "Table 7|4|p") == "contradicted"      # printed < 1e-5, counts give 6.4e-5


def test_table9_contradictions(book):
    for k in ("OR", "ci_low", "ci_high", "p"):
        assert verdict(book, f"Table 9|2|{k}") == "contradicted"
    assert verdict(book, "Table 9|3|OR") == "reproduced"
    assert verdict(book, "Table 9|3|ci_low") == "contradicted" and verdict(book, "Table 9|3|ci_high") == "contradicted"
    assert verdict(book, "Table 9|4|OR") == "contradicted"      # '—' although no cell is zero
    assert verdict(book, "Table 9|1|OR") == "reproduced"        # '—' with zero cells


def test_appendix_counts_sum_to_direction_counts(book):
    for ds in ("bordeaux", "mimic"):
        for d in ("M_to_F", "F_to_M"):
            assert verdict(book, f"s3.3|{ds}|n_{d}") == "reproduced"


def test_table6_and_8_from_counts(book):
    v = book[2]
    t6 = v[v.index.str.startswith("Table 6|")]
    assert (t6.verdict == "reproduced").all()
    assert verdict(book, "Table 8|2|cf<orig F") == "contradicted"   # 515/7743 = 6.65%, printed 6.6
    assert verdict(book, "Table 8|2|delta cf<") == "contradicted"
    assert verdict(book, "Table 8|3|delta cf<") == "contradicted"
    assert verdict(book, "Table 8|4|delta cf<") == "reproduced"


@pytest.mark.parametrize("col", list(R.TABLE3))
def test_pdr_reproduced_in_every_column(book, col):
    assert verdict(book, f"T3|{col}|PDR|estimate") == "reproduced"


def test_table3_as_printed_contradicts_itself(book):
    checks = book[1]
    for col in R.TABLE3:
        fails = checks[checks.group.str.startswith(f"Table 3 {col}") & ~checks.ok & (checks.kind == "exact")]
        assert len(fails) > 0, col
    for m in ("P_up_M_to_F", "P_down_M_to_F", "P_up_F_to_M", "P_down_F_to_M", "DTS_M_to_F", "DTS_F_to_M"):
        assert verdict(book, f"T3|bordeaux_full|{m}|estimate") == "contradicted"
    assert verdict(book, "T3|mimic_full|DTS_M_to_F|estimate") == "reproduced"
    assert verdict(book, "T3|mimic_full|NATS_up|estimate") == "contradicted"


def test_the_one_relabelling_that_explains_table3():
    permuted = {"P_up_M_to_F": "P_down_F_to_M", "P_down_M_to_F": "P_up_M_to_F",
                "P_up_F_to_M": "P_down_M_to_F", "P_down_F_to_M": "P_up_F_to_M"}
    for col in ("bordeaux_full", "bordeaux_text_iso", "bordeaux_tab_iso"):
        r = R.relabellings(col)
        assert len(r) >= 1 and not r.as_printed.any()
        for m, printed_as in permuted.items():
            assert (r[f"{m} is printed as"] == printed_as).all(), (col, m)
    full = R.relabellings("bordeaux_full")
    assert len(full) == 1 and full.nats_swapped.item() and not full.dts_swapped.item() and full.nmdf_one_level_ok.item()
    text = R.relabellings("bordeaux_text_iso")
    assert len(text) == 1 and text.nats_swapped.item() and text.dts_swapped.item() and text.nmdf_one_level_ok.item()
    assert not R.relabellings("bordeaux_tab_iso").nmdf_one_level_ok.any()
    mimic = R.relabellings("mimic_full")
    assert len(mimic) == 1 and mimic.nats_swapped.item() and not mimic.dts_swapped.item()
    for m in R.SLOTS:
        assert mimic[f"{m} is printed as"].item() == m


def test_headline_prose_and_impact(book):
    for nid in ("prose|s3.3 female variant skew, Bordeaux (pp)", "prose|s3.3 female variant skew, MIMIC-IV (pp)",
                "prose|Discussion skew (%)", "prose|Discussion impact France", "prose|Discussion impact United States",
                "prose|Discussion NMDF range, low", "prose|s3.3 Figure 4 NATS(-) FT (%)|estimate",
                "prose|s3.3 Figure 4 NATS(+) FT (%)|ci_high", "prose|s3.3 Figure 4 NATS(-) FT-FS difference (pp)"):
        assert verdict(book, nid) == "reproduced", nid
    assert verdict(book, "prose|Discussion DTS_M|F (%)") == "contradicted"
    assert verdict(book, "prose|Discussion DTS_F|M (%)") == "contradicted"
    assert verdict(book, "prose|Discussion NMDF range, high") == "contradicted if every change is one level"


def test_nmdf_conditional_verdicts(book):
    assert verdict(book, "T3|bordeaux_full|NMDF|estimate") == "reproduced"
    assert verdict(book, "T3|mimic_full|NMDF|estimate") == "reproduced"
    assert verdict(book, "T3|bordeaux_tab_iso|NMDF|estimate") == "contradicted if every change is one level"


def test_contradiction_sentences_name_printed_and_implied():
    lines = R.contradictions()
    assert any(l.startswith("Table 7 level 4: p") and "printed <1e-5" in l and "6.406e-05" in l for l in lines)
    assert any("Table 3 bordeaux_full: DTS_M_to_F" in l and "printed 1.3" in l for l in lines)
    assert len(lines) == int((~R.build_checks()[1].ok).sum())
