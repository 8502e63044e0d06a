"""`make docs`: a static HTML site under `_docs/` from the notebooks (`nbs/index.ipynb`, the front door and the source of
README.md, is the landing page), executed on synthetic data only, readable without a network.

Hand-written glue (Quarto cannot be installed on these machines; where it exists, `nbdev_docs` may be used instead).
Notebooks run with their default parameters, which are the smoke profile of a synthetic dataset; a notebook whose
default `dataset` is not open (per its manifest) is refused before anything runs. A run folder can be added to the
site with `--run DIR`, but only for open or synthetic datasets: a credentialed or restricted dataset's run is refused
(its rendered pages are aggregates only, but they are not for a public site), and so is a run folder whose dataset or
access level cannot be established (no run.json, no manifest).

A page reads like nbdev's: `#| hide` cells are left out, an `#| export` cell shows each public function and class it
defines as `show_doc` does (name, signature, docstring) instead of its source, and the `#|` directives are removed.
Formulas (`$...$`, `$$...$$` in markdown and docstrings) are typeset on the build machine by matplotlib's mathtext
into inline SVG images, so a page needs no MathJax or KaTeX from a CDN; a formula mathtext cannot parse is shown as
its LaTeX source in a code span (and counted). Links between notebooks (`X.ipynb`, `../part/X.ipynb`) point to their pages; the site keeps nbs/'s folders, and its
navigation groups the pages by the compendium's parts (`PART_TITLES`)."""
from __future__ import annotations

import argparse
import ast
import base64
import copy
import html
import io
import json
import os
import re
import shutil
import sys
from functools import lru_cache
from pathlib import Path

import matplotlib
from matplotlib import mathtext, rcParams
from matplotlib.font_manager import FontProperties

from .core import atomic_write_text, repo_root
from .data import load_manifest

_STYLE = """<style>body{font-family:system-ui,sans-serif;max-width:1000px;margin:1em auto;padding:0 1em}
nav.docs-nav{font-size:.9em;line-height:1.8;border-bottom:1px solid #ddd;padding-bottom:.5em;margin-bottom:1em}
img.math{vertical-align:middle} div.math-display{text-align:center;margin:.6em 0}
.show-doc h3{margin-bottom:.2em} .show-doc pre{background:#f6f8fa;padding:.5em;border-radius:4px;white-space:pre-wrap}
</style>"""
_PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>{title}</title>{style}
<style>code,pre{{background:#f6f6f6}}</style>
</head><body>{nav}{body}</body></html>"""


#: The parts of the compendium, in the order of nbs/'s folders, as the site's navigation groups them.
PART_TITLES = {"0_shared": "shared library", "1_audit": "human-triage audit (the paper)",
               "2_margins": "margin probes (YentlGuard)", "3_tbias": "transgender-bias probes (Hirsch et al.)"}


def notebook_names(nbs: Path) -> list[str]:
    """The site's notebooks as paths under `nbs` without `.ipynb` (`index`, `1_audit/02_emulator`,
    `1_audit/stages/05_emulator`): the landing page, then each part's chapters and its stages, in file order."""
    found = [p.relative_to(nbs).with_suffix("").as_posix() for p in nbs.rglob("*.ipynb")
             if not any(x.startswith(("_", ".")) for x in p.relative_to(nbs).parts)]
    return sorted(found, key=lambda n: (n != "index", n.split("/")[0], "/stages/" in n, n))


def _nav(pages: list[tuple[str, str]], depth: int = 0) -> str:
    """The navigation bar of a page `depth` folders below the site's root: README, then each part's chapters and stages
    (`pages`: (notebook name or report title, href from the root))."""
    up = "../" * depth
    groups: dict[str, list[str]] = {}
    for name, href in pages:
        part = name.split("/")[0] if "/" in name else ""
        title = name.rsplit("/", 1)[-1]
        if "/stages/" in name:
            title = f"stage {title}"
        elif part:
            title = title.split("_", 1)[1] if title[:2].isdigit() else title
        groups.setdefault(part, []).append(f"<a href='{up}{href}'>{html.escape(title)}</a>")
    rows = [f"<a href='{up}index.html'>triage_cf</a>"
            + ("".join(" · " + a for a in groups.pop("", [])))]
    for part, links in groups.items():
        rows.append(f"<b>{html.escape(PART_TITLES.get(part, part))}</b>: " + " · ".join(links))
    return "<nav class='docs-nav'>" + "<br>".join(rows) + "</nav>"


def _access(ds: str, what: str) -> str:
    "The manifest's access level of dataset `ds`; PermissionError (naming `what`) when it has no manifest."
    try:
        return load_manifest(ds).get("access")
    except FileNotFoundError:
        raise PermissionError(f"make docs refuses {what}: dataset {ds!r} has no manifest, so its access level is unknown") from None


def check_run_is_public(run_dir: Path) -> str:
    "The dataset of a run folder, if its manifest says open (synthetic datasets are open); else PermissionError."
    run_dir = Path(run_dir)
    try:
        run = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
        ds = run["dataset"]
    except (OSError, ValueError, KeyError):
        raise PermissionError(f"make docs refuses run folder {run_dir}: no readable run.json naming its dataset") from None
    access = _access(ds, f"run folder {run_dir}")
    if access != "open" or run.get("access", "open") != "open":
        raise PermissionError(f"make docs refuses run folder {run_dir}: dataset {ds!r} has access level "
                              f"{access if access != 'open' else run.get('access')!r}; only open and synthetic datasets are published")
    return ds


def check_notebook_is_public(nb_path: Path) -> str | None:
    "The default `dataset` parameter of a notebook (None if it has none), if open; else PermissionError."
    import papermill as pm
    params = pm.inspect_notebook(str(nb_path))
    if "dataset" not in params:
        return None
    default = params["dataset"].get("default")
    try:
        ds = ast.literal_eval(default)
    except (ValueError, SyntaxError):
        raise PermissionError(f"make docs refuses notebook {nb_path}: its default dataset {default!r} is not a literal") from None
    access = _access(ds, f"notebook {nb_path}")
    if access != "open":
        raise PermissionError(f"make docs refuses notebook {nb_path}: its default dataset {ds!r} has access level {access!r}; "
                              "the docs execute notebooks on open and synthetic data only")
    return ds


# ---------------------------------------------------------------- formulas: typeset here, no network at reading time

_CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)
_MATH = re.compile(r"\$\$(.+?)\$\$|(?<![\\$\w])\$(?![\s$])((?:[^$\n]|\n(?!\s*\n))+?)(?<![\s\\])\$(?![\w$])", re.S)
_SIZING = re.compile(r"\\(?:big|Big|bigg|Bigg)[lrm]?(?![a-zA-Z])")
#: formulas mathtext could not typeset in this process (shown as LaTeX source)
MATH_FAILURES: list[str] = []


@lru_cache(maxsize=8192)
def math_img(tex: str, display: bool = False, size: float = 13.0) -> str | None:
    """An `<img>` holding the SVG of LaTeX `tex` typeset by matplotlib's mathtext (glyphs as paths: no font, no
    network), aligned on the text's baseline; None when mathtext cannot parse `tex`."""
    matplotlib.use("Agg")
    rcParams["svg.hashsalt"] = "triage_cf-docs"           # stable glyph ids: the same formula gives the same bytes
    buf = io.BytesIO()
    src = _SIZING.sub("", tex.strip())                    # \big( and friends: mathtext sizes delimiters itself
    try:
        depth = mathtext.math_to_image(f"${src}$", buf, prop=FontProperties(size=size), dpi=72, format="svg")
    except Exception:                                     # mathtext's parser raises ValueError; be safe with the rest
        return None
    svg = re.sub(rb"<metadata>.*?</metadata>", b"", buf.getvalue(), flags=re.S)
    uri = "data:image/svg+xml;base64," + base64.b64encode(svg).decode("ascii")
    style = "" if display else f' style="vertical-align:-{float(depth):.1f}px"'
    return f'<img class="math" alt="{html.escape(tex.strip(), quote=True)}" src="{uri}"{style}>'


def typeset_math(markdown: str) -> str:
    "Markdown with every `$...$` and `$$...$$` outside code replaced by its typeset image (code spans are left alone)."
    parts, last = [], 0
    for m in _CODE.finditer(markdown):
        parts += [("text", markdown[last:m.start()]), ("code", m.group())]
        last = m.end()
    parts.append(("text", markdown[last:]))

    def one(m: re.Match) -> str:
        display, tex = m.group(1) is not None, m.group(1) if m.group(1) is not None else m.group(2)
        img = math_img(tex, display)
        if img is None:
            MATH_FAILURES.append(tex)
            return f"`{tex.strip()}`"
        return f'<div class="math-display">{img}</div>' if display else img
    return "".join(_MATH.sub(one, t) if kind == "text" else t for kind, t in parts)


# ---------------------------------------------------------------- show_doc: signatures and docstrings of export cells

def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef, name: str | None = None) -> str:
    ret = f" -> {ast.unparse(node.returns)}" if node.returns else ""
    return f"{name or node.name}({ast.unparse(node.args)}){ret}"


def _doc_block(node, level: int = 3) -> str:
    "One object as nbdev's show_doc renders it: a heading, the signature in a code block, the docstring."
    doc = ast.get_docstring(node) or ""
    if isinstance(node, ast.ClassDef):
        init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        fields = [ast.unparse(n) for n in node.body if isinstance(n, ast.AnnAssign)]
        bases = f"({', '.join(ast.unparse(b) for b in node.bases)})" if node.bases else ""
        if init is not None:
            args = copy.deepcopy(init.args)
            args.args = args.args[1:]                     # drop self
            sig = f"class {node.name}{bases}: {node.name}({ast.unparse(args)})"
        else:
            sig = f"class {node.name}{bases}" + (":\n    " + "\n    ".join(fields) if fields else "")
    else:
        sig = ("async def " if isinstance(node, ast.AsyncFunctionDef) else "def ") + _signature(node)
    out = [f"{'#' * level} {node.name}", "", "```python", sig, "```", ""]
    if doc:
        out += [doc, ""]
    if isinstance(node, ast.ClassDef):                    # public methods and properties, one level down
        for n in node.body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and not n.name.startswith("_"):
                out.append(_doc_block(n, min(level + 1, 6)))
    return "\n".join(out)


def show_doc_markdown(source: str) -> str | None:
    "The show_doc markdown of an `#| export` cell: every public top-level function and class; None if it defines none."
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    blocks = [_doc_block(n) for n in tree.body
              if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not n.name.startswith("_")]
    return "\n\n".join(blocks) if blocks else None


_DIRECTIVE = re.compile(r"^\s*#\s*\|\s*([\w-]+)(.*)$")


def _directives(source: str) -> dict[str, str]:
    return {m.group(1): m.group(2).strip() for line in source.splitlines() if (m := _DIRECTIVE.match(line))}


def docs_notebook(nb):
    """The page version of an (executed) notebook: `#| hide` and `default_exp` cells left out, `#| export` cells shown
    as show_doc blocks (their outputs dropped), other cells without their directive lines, formulas typeset."""
    import nbformat
    out = copy.deepcopy(nb)
    cells = []
    for cell in out.cells:
        d = _directives(cell.source) if cell.cell_type == "code" else {}
        if "hide" in d or "default_exp" in d:
            continue
        if {"export", "exporti", "exports"} & set(d):
            md = show_doc_markdown(cell.source)
            if "exports" in d:                                # nbdev: show the source too
                cells.append(nbformat.v4.new_code_cell("\n".join(l for l in cell.source.splitlines() if not _DIRECTIVE.match(l))))
            if md and "exporti" not in d:
                cells.append(nbformat.v4.new_markdown_cell(f'<div class="show-doc">\n\n{md}\n\n</div>'))
            continue
        if cell.cell_type == "code":
            cell.source = "\n".join(l for l in cell.source.splitlines() if not _DIRECTIVE.match(l))
        cells.append(cell)
    for cell in cells:
        if cell.cell_type == "markdown":
            cell.source = typeset_math(cell.source)
    out.cells = cells
    return out


_MATHJAX = re.compile(r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->", re.S)
_REMOTE_SCRIPT = re.compile(r"<script[^>]*\bsrc=\"https?://[^\"]*\"[^>]*>\s*</script>")   # e.g. require.js (widgets only)
_NB_LINK = re.compile(r'href="([\w./-]+)\.ipynb(#[^"]*)?"')


def page_html(nb, nav: str = "") -> str:
    "The HTML page of a notebook: nbconvert's lab template without its MathJax loader, notebook links to pages, `nav` on top."
    from nbconvert import HTMLExporter
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(docs_notebook(nb))
    body = _REMOTE_SCRIPT.sub("", _MATHJAX.sub("", body))
    body = _NB_LINK.sub(lambda m: f'href="{m.group(1)}.html{m.group(2) or ""}"', body)
    return _insert_nav(body.replace("</head>", _STYLE + "\n</head>", 1), nav)


#: A markdown link to a notebook by a relative path (not a URL, not an anchor of the same page).
_MD_NB_LINK = re.compile(r"\]\(((?![a-z]+:|#|/)[\w./-]+\.ipynb(?:#[^)]*)?)\)")
#: The first line of the generated README.
README_HEADER = ("<!-- Generated from nbs/index.ipynb by `make readme` (python -m triage_cf.docs --readme): edit the "
                 "notebook, not this file. -->")


def readme_markdown(nb, nbs_prefix: str = "nbs/") -> str:
    """The repository's README.md from the front-door notebook `nb` (`nbs/index.ipynb`, settings.ini's `readme_nb`): its
    markdown cells, and its code cells that are not hidden (as fenced Python, without their directives), with links to
    notebooks made relative to the repository's root. Formulas stay `$...$` (GitHub renders them). It replaces
    `nbdev_readme`, which needs Quarto (not installable on these machines)."""
    parts = [README_HEADER]
    for cell in nb.cells:
        src = cell.source.strip("\n")
        if cell.cell_type == "code":
            d = _directives(src)
            if "hide" in d or "default_exp" in d or not src:
                continue
            body = "\n".join(line for line in src.splitlines() if not _DIRECTIVE.match(line))
            text = f"```python\n{body}\n```"
        elif cell.cell_type == "markdown":
            text = src
        else:
            continue
        parts.append(_MD_NB_LINK.sub(lambda m: f"]({nbs_prefix}{m.group(1)})", text))
    return "\n\n".join(parts) + "\n"


def write_readme(root: Path | None = None) -> Path:
    "Write `README.md` at the repository's root from `nbs/index.ipynb` (only when its bytes change); returns its path."
    import nbformat
    root = Path(root or repo_root())
    text = readme_markdown(nbformat.read(root / "nbs" / "index.ipynb", as_version=4))
    target = root / "README.md"
    if not target.exists() or target.read_text(encoding="utf-8") != text:
        target.write_text(text, encoding="utf-8")
    return target


def _insert_nav(page: str, nav: str) -> str:
    m = re.search(r"<body[^>]*>", page)
    return page if m is None else page[:m.end()] + nav + page[m.end():]


def _md_to_html(text: str) -> str:
    try:
        from nbconvert.filters.markdown import markdown2html
        return markdown2html(typeset_math(text))
    except Exception:
        return "<pre>" + html.escape(text) + "</pre>"


def _build(out: Path | None, runs: list[Path], notebooks: list[str] | None) -> Path:
    import nbformat
    import papermill as pm
    root = repo_root()
    out = Path(out or root / "_docs")
    names = notebooks or notebook_names(root / "nbs")
    for r in runs:  # refuse before doing any work
        check_run_is_public(Path(r))
    for name in names:
        check_notebook_is_public(root / "nbs" / f"{name}.ipynb")
    out.mkdir(parents=True, exist_ok=True)
    work = root / ".cache" / "docs" / "executed"  # executions and their synthetic runs stay outside the site (gitignored)
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TRIAGE_CF_RUNS", str(root / ".cache" / "docs" / "runs"))
    pages = [(n, f"{n}.html") for n in names if n != "index"]
    reports = [(f"report {check_run_is_public(Path(r))}", f"report-{check_run_is_public(Path(r))}-{Path(r).name}.html") for r in runs]
    nav = _nav(pages + reports)
    MATH_FAILURES.clear()
    for name in names:
        print(f"docs: executing {name}", flush=True)
        executed = work / f"{name}.ipynb"
        executed.parent.mkdir(parents=True, exist_ok=True)
        source = root / "nbs" / f"{name}.ipynb"
        pm.execute_notebook(str(source), str(executed), kernel_name="python3", cwd=str(source.parent), progress_bar=False)
        target = out / ("index.html" if name == "index" else f"{name}.html")
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(target, page_html(nbformat.read(executed, as_version=4), _nav(pages + reports, name.count("/"))))
    for r, (_, target) in zip(runs, reports):
        shutil.copy(Path(r) / "report.html", out / target)
    if "index" not in names:   # a partial build still has a landing page: the front door (the README), unexecuted
        front = readme_markdown(nbformat.read(root / "nbs" / "index.ipynb", as_version=4), nbs_prefix="")
        body = _NB_LINK.sub(lambda m: f'href="{m.group(1)}.html{m.group(2) or ""}"', _md_to_html(front))
        atomic_write_text(out / "index.html", _PAGE.format(title="triage_cf", style=_STYLE, nav=nav, body=body))
    for f in out.rglob("*"):                  # a site is read by others: the atomic writes' 0600 is too strict
        if f.is_file():
            f.chmod(0o644)
    if MATH_FAILURES:
        print(f"docs: {len(MATH_FAILURES)} formula(s) shown as LaTeX source (mathtext cannot typeset them): "
              + "; ".join(sorted(set(MATH_FAILURES))[:10]), flush=True)
    print(f"docs: {out / 'index.html'}")
    return out / "index.html"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m triage_cf.docs", description=__doc__)
    p.add_argument("--out", default=None)
    p.add_argument("--run", action="append", default=[], help="add this run folder's report (open/synthetic datasets only)")
    p.add_argument("--readme", action="store_true", help="only write README.md from nbs/index.ipynb (no site)")
    p.add_argument("--notebook", action="append", default=None, help="only these notebooks (paths under nbs/ without .ipynb, e.g. 1_audit/08_metrics)")
    a = p.parse_args(argv)
    if a.readme:
        print(f"docs: {write_readme()}")
        return 0
    try:
        _build(Path(a.out) if a.out else None, [Path(r) for r in a.run], a.notebook)
    except PermissionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
