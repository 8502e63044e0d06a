"""The docs site reads like nbdev's and needs no network: formulas are typeset at build time (MathML, which browsers
render natively), export cells show their functions' signatures and docstrings, hidden cells are left out, notebook
links point to pages. The metrics chapter's page is rendered in headless Chromium (Debian's `chromium`)."""
import contextlib
import html
import io
import json
import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest

pytest.importorskip("nbconvert")

from triage_cf import docs  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")


def _clear_math_log():
    for outcome in docs.MATH_LOG.values():
        outcome.clear()


def test_formulas_are_typeset_as_mathml_outside_code_only():
    md = "The rate $\\mathrm{PDR} = P(y' \\ne y)$, `cost $5 and $6` in code, and\n$$P^{\\uparrow}_{M\\to F}$$ shown."
    out = docs.typeset_math(md)
    assert out.count("<math ") == 2 and out.count('display="block"') == 1
    assert "$" not in out.replace("`cost $5 and $6`", "")
    assert "`cost $5 and $6`" in out                                  # code spans untouched
    assert 'alttext="\\mathrm{PDR} = P(y&#x27; \\ne y)"' in out        # the LaTeX stays as alt text
    assert "<mo>&#x02260;</mo>" in out and "\n" not in re.search(r"<math .*?</math>", out, re.S).group()
    assert docs.mathml("x_1") == docs.mathml("x_1")                  # same formula, same bytes


def test_a_formula_latex2mathml_cannot_read_is_shown_as_source_and_counted():
    _clear_math_log()
    out = docs.typeset_math("see $\\left( a$ and $\\foo{x}$ here, $y$ typeset")
    assert out.startswith("see `\\left( a` and `\\foo{x}` here, <math ")
    assert docs.MATH_LOG == {"untypeset": ["\\left( a", "\\foo{x}"], "typeset": ["y"]}
    assert docs.math_report().startswith("docs: 2 formula(s) left as LaTeX source (untypeset), 1 typeset as MathML: ")


def test_the_latex_the_notebooks_use_is_normalised_where_latex2mathml_misreads_it():
    assert docs.normalise_tex("\\operatorname{logit} P(Y \\le k)") == "\\mathrm{logit}\\, P(Y \\le k)"
    assert docs.normalise_tex("\\arg\\max_y\n  p_y") == "\\mathrm{arg}\\,\\max_y p_y"
    for tex in ["\\operatorname{logit} P", "\\hat y = \\arg\\max_y p_y", "P(y \\mid x)", "\\Phi\\big(z\\big)",
                "\\tfrac12", "\\text{(clinical acuity)}", "\\Lambda\\!\\left(\\frac{c_k - \\mu(x)}{\\sigma}\\right)",
                "C=\\begin{pmatrix}1&1\\\\0&1\\end{pmatrix}", "\\#\\{k : s > c_k\\}", "\\bar\\theta \\pm z"]:
        out = docs.mathml(tex)
        assert out is not None and "\\" not in html.unescape(re.sub(r"<[^>]+>", "", out)), tex
    # styled letters Chromium would draw plain (it ignores mathvariant) are written in Unicode's math alphabets
    assert "<mi>ℒ</mi>" in docs.mathml("\\mathcal L(\\theta)") and "<mn>𝟙</mn>" in docs.mathml("\\mathbb{1}[x]")
    assert "mathvariant=\"script\"" not in docs.mathml("\\mathcal L")


def test_every_formula_of_the_notebooks_is_typeset():
    "Formulas are in markdown cells and docstrings, so the unexecuted notebooks hold them all: none is left as source."
    _clear_math_log()
    for name in docs.notebook_names(REPO / "nbs"):
        docs.docs_notebook(nbformat.read(REPO / "nbs" / f"{name}.ipynb", as_version=4))
    assert docs.MATH_LOG["untypeset"] == [], docs.math_report()
    assert len(docs.MATH_LOG["typeset"]) > 500


def test_show_doc_gives_signature_and_docstring_of_public_objects():
    src = ('def f(x: int, y: float = 1.0) -> str:\n    "Half of $x$."\n    return ""\n\n'
           'def _hidden(): pass\n\nclass Box:\n    "A box."\n    def __init__(self, n: int): self.n = n\n'
           '    def size(self) -> int:\n        "Its size."\n        return self.n\n')
    md = docs.show_doc_markdown(src)
    assert "### f\n\n```python\ndef f(x: int, y: float=1.0) -> str\n```\n\nHalf of $x$." in md
    assert "_hidden" not in md
    assert "### Box" in md and "class Box: Box(n: int)" in md and "#### size" in md and "Its size." in md
    assert docs.show_doc_markdown("x = 1\n") is None
    # a non-raw docstring of the sources doubles a formula's backslashes: its value, which show_doc uses, has one
    assert "$\\mathrm{PDR}$" in docs.show_doc_markdown('def g():\n    "The $\\\\mathrm{PDR}$."\n')


def test_page_hides_hidden_cells_documents_exports_and_loads_nothing_remote():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# t\n\nSee [core](0_shared/00_core.ipynb) and $\\mathcal{I}$."),
                nbformat.v4.new_code_cell("#| default_exp t"),
                nbformat.v4.new_code_cell("#| hide\nfrom fastcore.test import test_eq"),
                nbformat.v4.new_code_cell('#| export\ndef g(a) -> int:\n    "The $g_{*}$ of `a`, *not* $a^*$."\n'
                                          '    return 1'),
                nbformat.v4.new_code_cell("g(2)", outputs=[nbformat.v4.new_output(   # Markdown(...) in a cell
                    "display_data", data={"text/markdown": "is $g_2$", "text/plain": "<Markdown>"})])]
    page = docs.page_html(nb, "<nav class='docs-nav'>NAV</nav>")
    assert "fastcore" not in page and "default_exp" not in page and "#| export" not in page
    text = re.sub(r"<[^>]+>", "", page)
    assert 'class="show-doc"' in page and "def g(a) -&gt; int" in text and page.count("<math ") == 4
    assert "<em>not</em>" in page and page.count("<em>") == 1       # markdown's emphasis, none inside the MathML
    assert 'href="0_shared/00_core.html"' in page and ".ipynb" not in page
    assert not re.findall(r'<script[^>]*src="https?://', page) and "mathjax" not in page.lower()
    assert re.search(r"<body[^>]*><nav class='docs-nav'>NAV</nav>", page)


def test_an_echo_false_cell_shows_its_output_without_its_code():
    "The cells that render measured results from their files (`#| echo: false`) show the result, not the code."
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("#| echo: false\nMarkdown(_rows_from_results_json)", outputs=[
                    nbformat.v4.new_output("display_data", data={"text/markdown": "measured: **2 runs**",
                                                                 "text/plain": "<Markdown>"})]),
                nbformat.v4.new_code_cell("shown_code(1)")]
    page = docs.page_html(nb)
    assert "<strong>2 runs</strong>" in page and "_rows_from_results_json" not in page and "shown_code" in page


def test_importing_the_package_in_a_kernel_prints_no_progress_bar_warning():
    """tqdm.auto, in a Jupyter kernel without ipywidgets, warns with the environment's path at its import: the front
    door's example printed it on the site. The package imports it with that message filtered."""
    from nbclient import NotebookClient
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import triage_cf.audit.metrics\nfrom tqdm.auto import tqdm\n"
                                          "print([c.__module__ for c in tqdm.__mro__])")]
    NotebookClient(nb, kernel_name="python3", timeout=300).execute()
    text = "".join(o.get("text", "") for o in nb.cells[0].outputs)
    assert "TqdmWarning" not in text and "IProgress" not in text, text
    assert "tqdm.std" in text and "tqdm.notebook" not in text, text     # text bars


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



def test_every_relative_link_resolves_in_the_repository():
    """Where a reader meets the sources, JupyterLab on nbs/ and GitHub: every relative markdown link of the notebooks,
    the guides (docs_src/) and README.md leads to a file of the repository (`/docs_src/x.md` would work on GitHub
    only, not in JupyterLab)."""
    link = re.compile(r"\]\(((?![a-z]+:|#)[^)\s]+)\)")
    texts = [(nb, "".join(c["source"])) for nb in sorted((REPO / "nbs").rglob("*.ipynb"))
             if ".ipynb_checkpoints" not in nb.parts
             for c in json.loads(nb.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "markdown"]
    texts += [(md, md.read_text(encoding="utf-8")) for md in [*sorted((REPO / "docs_src").glob("*.md")), REPO / "README.md"]]
    links = [(f, m.group(1)) for f, text in texts for m in link.finditer(text)]
    broken = [f"{f.relative_to(REPO)}: {target}" for f, target in links
              if target.startswith("/") or not (f.parent / target.partition("#")[0]).exists()]
    assert len(links) > 100 and broken == [], broken


def test_the_chapters_built_for_the_site_show_the_users_runs_not_their_own_examples(tmp_path, monkeypatch):
    """`make docs` sends the chapters' example runs to a cache folder (they must not land among the user's runs), while
    a chapter that shows measured results (the metrics chapter's table of default runs) reads `shown_runs_root`: the
    runs root the build started with."""
    for var in ("TRIAGE_CF_RUNS", "TRIAGE_CF_SHOWN_RUNS"):     # recorded, so that both come back after the test
        monkeypatch.setenv(var, "x")
        monkeypatch.delenv(var)
    from triage_cf.core import repo_root, runs_root, shown_runs_root
    mine = runs_root()
    with contextlib.redirect_stdout(io.StringIO()):
        docs.build_site(tmp_path / "site", notebooks=["2_margins/00_measures"], execute=False)
    assert shown_runs_root() == mine == repo_root() / "runs"
    assert runs_root() == repo_root() / ".cache" / "docs" / "runs"


class _Links(HTMLParser):
    "The targets a page links to or loads (`a`/`link` href, `img`/`script` src) and the anchors it has (ids)."
    def __init__(self):
        super().__init__()
        self.targets, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.ids.update(v for k, v in a.items() if k == "id" or (tag == "a" and k == "name"))
        self.targets += [a[k] for k in ("href", "src") if tag in ("a", "link", "img", "script") and a.get(k)]


def test_every_link_of_the_site_leads_to_a_page_and_its_anchor(tmp_path, capsys):
    """The whole site, built as saved (no execution: the links are in the prose and the docstrings): every relative link
    of every page (chapters, stages, the front door, the guides of docs_src/) leads to a file of the site, and every
    anchor it names exists there. A link from the front door to a guide, or from a guide to a chapter, that works in
    JupyterLab or on GitHub but not in the site fails here."""
    docs.build_site(tmp_path / "site", execute=False)
    assert "docs: 0 formula(s) left as LaTeX source (untypeset)" in capsys.readouterr().out
    pages = {}
    for f in (tmp_path / "site").rglob("*.html"):
        pages[f.resolve()] = _Links()
        pages[f.resolve()].feed(f.read_text(encoding="utf-8"))
    guides = {p.stem for p in (tmp_path / "site" / "docs_src").glob("*.html")}
    assert guides == {p.stem for p in (REPO / "docs_src").glob("*.md")}
    assert len(pages) == len(docs.notebook_names(REPO / "nbs")) + len(guides)
    broken, links = [], 0
    for f, page in pages.items():
        for target in page.targets:
            if re.match(r"[a-z]+:|//", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (f.parent / path).resolve() if path else f
            links += 1
            if not linked.exists() or (anchor and linked in pages and anchor not in pages[linked].ids):
                broken.append(f"{f.relative_to((tmp_path / 'site').resolve())}: {target}")
    assert links > 1000 and broken == [], broken
    front = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert 'href="docs_src/chain.html"' in front and ".md\"" not in front

#: Run in the page by Chromium: the layout of its formulas, as JSON in the body's `data-probe` attribute. A `<math>`
#: element the browser does not lay out as mathematics is an unknown inline element: a fraction's numerator would sit
#: beside its denominator, a subscript on its base's baseline.
_PROBE = """<script>
const box = e => e.getBoundingClientRect();
const maths = [...document.querySelectorAll("math")], fracs = [...document.querySelectorAll("mfrac")];
const subs = [...document.querySelectorAll("msub")], sups = [...document.querySelectorAll("msup")];
document.body.setAttribute("data-probe", JSON.stringify({
  math: maths.length, mathml: maths.filter(m => m instanceof MathMLElement).length,
  empty: maths.filter(m => box(m).width < 1 || box(m).height < 1).length,
  fracs: fracs.length, stacked: fracs.filter(f => box(f.children[0]).bottom <= box(f.children[1]).top + 1).length,
  subs: subs.length, lowered: subs.filter(s => box(s.children[1]).bottom > box(s.children[0]).bottom + 1).length,
  sups: sups.length, raised: sups.filter(s => box(s.children[1]).top < box(s.children[0]).top - 1).length}));
</script>"""


def chromium(profile: Path, *args: str) -> str:
    "Headless Chromium (as root it needs --no-sandbox), nothing fetched from the network; its stdout."
    cmd = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=True).stdout


class _Text(HTMLParser):
    "The text of a page, split into what is in `<math>` elements and the prose (code, scripts and styles left out)."
    SKIP = {"script", "style", "pre", "code"}

    def __init__(self):
        super().__init__()
        self.stack, self.math, self.prose = [], [], []

    def handle_starttag(self, tag, attrs):
        self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in self.stack:
            del self.stack[len(self.stack) - 1 - self.stack[::-1].index(tag):]

    def handle_data(self, data):
        if self.SKIP & set(self.stack):
            return
        (self.math if "math" in self.stack else self.prose).append(data)


@pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium (Debian: apt-get install -y chromium)")
def test_the_metrics_page_renders_its_formulas_in_chromium(tmp_path, monkeypatch):
    """The metrics chapter (most of the compendium's formulas) built as `make docs` builds it (executed: its markdown
    outputs have formulas too), then laid out by headless Chromium: every formula as mathematics, no LaTeX left."""
    monkeypatch.setenv("TRIAGE_CF_RUNS", str(tmp_path / "runs"))        # the execution's synthetic runs
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        docs.build_site(tmp_path / "site", notebooks=["1_audit/08_metrics"])
    assert re.search(r"^docs: 0 formula\(s\) left as LaTeX source \(untypeset\), \d+ typeset", out.getvalue(), re.M), \
        out.getvalue()
    page = (tmp_path / "site" / "1_audit" / "08_metrics.html").read_text(encoding="utf-8")
    probed = tmp_path / "site" / "1_audit" / "probed.html"
    probed.write_text(page.replace("</body>", _PROBE + "</body>"), encoding="utf-8")
    dom = chromium(tmp_path / "profile", "--dump-dom", probed.as_uri())
    probe = json.loads(html.unescape(re.search(r'data-probe="([^"]*)"', dom).group(1)))
    n = page.count("<math ")
    assert n > 150 and probe["math"] == probe["mathml"] == n and probe["empty"] == 0, probe
    assert probe["fracs"] >= 1 and probe["stacked"] == probe["fracs"], probe
    assert probe["subs"] > 20 and probe["lowered"] == probe["subs"], probe
    assert probe["sups"] > 5 and probe["raised"] == probe["sups"], probe
    text = _Text()
    text.feed(dom)
    prose, math = " ".join(text.prose), " ".join(text.math)
    assert not re.findall(r"\\[a-zA-Z]+|\$[^$\s][^$]*\$", prose), "LaTeX left in the page's text"
    assert "\\" not in math and "&" not in math and "$" not in math, "LaTeX or character references in formulas"
