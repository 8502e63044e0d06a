"""The docs site reads like nbdev's and needs no network: formulas are typeset at build time (inline SVG), export cells
show their functions' signatures and docstrings, hidden cells are left out, notebook links point to pages."""
import base64
import re
from pathlib import Path

import nbformat
import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("nbconvert")

from triage_cf import docs  # noqa: E402


def _svg(img: str) -> bytes:
    return base64.b64decode(re.search(r'src="data:image/svg\+xml;base64,([^"]+)"', img).group(1))


def test_formulas_are_typeset_outside_code_only():
    md = "The rate $\\mathrm{PDR} = P(y' \\ne y)$, `cost $5 and $6` in code, and\n$$P^{\\uparrow}_{M\\to F}$$ shown."
    out = docs.typeset_math(md)
    assert out.count('class="math"') == 2 and '<div class="math-display">' in out
    assert "`cost $5 and $6`" in out                                  # code spans untouched
    assert 'alt="\\mathrm{PDR} = P(y&#x27; \\ne y)"' in out           # the LaTeX stays as alt text
    svg = _svg(out)
    assert svg.startswith(b"<?xml") and b"<path" in svg and b"<metadata>" not in svg   # glyphs as paths, no date
    assert docs.math_img("x_1") == docs.math_img("x_1")              # same formula, same bytes


def test_a_formula_mathtext_cannot_parse_is_shown_as_source_and_counted():
    docs.MATH_FAILURES.clear()
    out = docs.typeset_math("see $\\begin{aligned}a\\end{aligned}$ here")
    assert out == "see `\\begin{aligned}a\\end{aligned}` here" and docs.MATH_FAILURES == ["\\begin{aligned}a\\end{aligned}"]
    assert docs.math_img("\\Phi\\big(z\\big)") is not None           # sizing commands are dropped, not failures


def test_show_doc_gives_signature_and_docstring_of_public_objects():
    src = ('def f(x: int, y: float = 1.0) -> str:\n    "Half of $x$."\n    return ""\n\n'
           'def _hidden(): pass\n\nclass Box:\n    "A box."\n    def __init__(self, n: int): self.n = n\n'
           '    def size(self) -> int:\n        "Its size."\n        return self.n\n')
    md = docs.show_doc_markdown(src)
    assert "### f\n\n```python\ndef f(x: int, y: float=1.0) -> str\n```\n\nHalf of $x$." in md
    assert "_hidden" not in md
    assert "### Box" in md and "class Box: Box(n: int)" in md and "#### size" in md and "Its size." in md
    assert docs.show_doc_markdown("x = 1\n") is None


def test_page_hides_hidden_cells_documents_exports_and_loads_nothing_remote():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# t\n\nSee [core](0_shared/00_core.ipynb) and $\\mathcal{I}$."),
                nbformat.v4.new_code_cell("#| default_exp t"),
                nbformat.v4.new_code_cell("#| hide\nfrom fastcore.test import test_eq"),
                nbformat.v4.new_code_cell('#| export\ndef g(a) -> int:\n    "The $g$ of `a`."\n    return 1'),
                nbformat.v4.new_code_cell("g(2)")]
    page = docs.page_html(nb, "<nav class='docs-nav'>NAV</nav>")
    assert "fastcore" not in page and "default_exp" not in page and "#| export" not in page
    text = re.sub(r"<[^>]+>", "", page)
    assert 'class="show-doc"' in page and "def g(a) -&gt; int" in text and page.count('class="math"') == 2
    assert 'href="0_shared/00_core.html"' in page and ".ipynb" not in page
    assert not re.findall(r'<script[^>]*src="https?://', page) and "mathjax" not in page.lower()
    assert re.search(r"<body[^>]*><nav class='docs-nav'>NAV</nav>", page)


def test_the_site_keeps_the_folders_and_groups_its_navigation_by_part(tmp_path):
    for n in ["index", "1_audit/00_split", "1_audit/stages/03_split", "0_shared/stages/01_data", "0_shared/00_core",
              "1_audit/01_null_control", "2_margins/00_measures", "1_audit/.ipynb_checkpoints/00_split-checkpoint"]:
        (tmp_path / f"{n}.ipynb").parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f"{n}.ipynb").write_text("{}")
    names = docs.notebook_names(tmp_path)
    assert names == ["index", "0_shared/00_core", "0_shared/stages/01_data", "1_audit/00_split", "1_audit/01_null_control",
                     "1_audit/stages/03_split", "2_margins/00_measures"]
    nav = docs._nav([(n, f"{n}.html") for n in names if n != "index"] + [("report synth-en", "report-synth-en-x.html")], 2)
    rows = nav.split("<br>")
    assert [re.sub(r"<[^>]+>", "", r).split(":")[0] for r in rows[1:]] == [
        "shared library", "human-triage audit (the paper)", "margin probes (YentlGuard)"]
    assert "href='../../1_audit/00_split.html'>split</a>" in rows[2] and ">stage 03_split</a>" in rows[2]
    assert "href='../../report-synth-en-x.html'" in rows[0] and "href='../../index.html'" in rows[0]
    # a link from a chapter to another part's chapter becomes a link between their pages
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("See [g](../0_shared/04_rewrite.ipynb#the-terms).")]
    assert 'href="../0_shared/04_rewrite.html#the-terms"' in docs.page_html(nb)


def test_the_readme_is_generated_from_the_front_door_notebook():
    "README.md is nbs/index.ipynb rendered (`make readme`): a README edited by hand, or a stale one, fails here."
    root = Path(__file__).resolve().parents[1]
    expected = docs.readme_markdown(nbformat.read(root / "nbs" / "index.ipynb", as_version=4))
    assert (root / "README.md").read_text(encoding="utf-8") == expected, "README.md differs from nbs/index.ipynb: run make readme"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# t\n\nSee [metrics](1_audit/08_metrics.ipynb), [a](#a), [w](https://x.org/y.ipynb)."),
                nbformat.v4.new_code_cell("#| hide\nimport os"), nbformat.v4.new_code_cell("#| eval: false\nprint(1)")]
    md = docs.readme_markdown(nb)
    assert md.splitlines()[0] == docs.README_HEADER and "[metrics](nbs/1_audit/08_metrics.ipynb)" in md
    assert "[a](#a)" in md and "(https://x.org/y.ipynb)" in md and "import os" not in md and "```python\nprint(1)\n```" in md
