"""`make docs`: a static HTML site under `_docs/` from the README and the notebooks, executed on synthetic data only.

Hand-written glue (Quarto cannot be installed on these machines; where it exists, `nbdev_docs` may be used instead).
Notebooks run with their default parameters, which are the smoke profile of a synthetic dataset; a notebook whose
default `dataset` is not open (per its manifest) is refused before anything runs. A run folder can be added to the
site with `--run DIR`, but only for open or synthetic datasets: a credentialed or restricted dataset's run is refused
(its rendered pages are aggregates only, but they are not for a public site), and so is a run folder whose dataset or
access level cannot be established (no run.json, no manifest)."""
from __future__ import annotations

import argparse
import ast
import html
import json
import os
import shutil
import sys
from pathlib import Path

from .core import atomic_write_text, repo_root

_PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:960px;margin:2em auto;padding:0 1em}}code,pre{{background:#f6f6f6}}</style>
</head><body>{nav}{body}</body></html>"""


def _nav(pages: list[tuple[str, str]]) -> str:
    return "<nav><a href='index.html'>README</a> · " + " · ".join(f"<a href='{h}'>{html.escape(t)}</a>" for t, h in pages) + "</nav><hr>"


def _access(ds: str, what: str) -> str:
    "The manifest's access level of dataset `ds`; PermissionError (naming `what`) when it has no manifest."
    from .data import load_manifest
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


def _md_to_html(text: str) -> str:
    try:
        from nbconvert.filters.markdown import markdown2html
        return markdown2html(text)
    except Exception:
        return "<pre>" + html.escape(text) + "</pre>"


def _build(out: Path | None, runs: list[Path], notebooks: list[str] | None) -> Path:
    import papermill as pm
    from .chain import render_html
    root = repo_root()
    out = Path(out or root / "_docs")
    names = notebooks or sorted(p.stem for p in (root / "nbs").glob("*.ipynb") if not p.name.startswith(("_", ".")))
    for r in runs:  # refuse before doing any work
        check_run_is_public(Path(r))
    for name in names:
        check_notebook_is_public(root / "nbs" / f"{name}.ipynb")
    out.mkdir(parents=True, exist_ok=True)
    work = root / ".cache" / "docs" / "executed"  # executions and their synthetic runs stay outside the site (gitignored)
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TRIAGE_CF_RUNS", str(root / ".cache" / "docs" / "runs"))
    pages = []
    for name in names:
        print(f"docs: executing {name}", flush=True)
        executed = work / f"{name}.ipynb"
        pm.execute_notebook(str(root / "nbs" / f"{name}.ipynb"), str(executed), kernel_name="python3",
                            cwd=str(root / "nbs"), progress_bar=False)
        render_html(executed, out / f"{name}.html")
        pages.append((name, f"{name}.html"))
    for r in runs:
        ds = check_run_is_public(Path(r))
        target = f"report-{ds}-{Path(r).name}.html"
        shutil.copy(Path(r) / "report.html", out / target)
        pages.append((f"report {ds}", target))
    readme = (root / "README.md").read_text(encoding="utf-8")
    atomic_write_text(out / "index.html", _PAGE.format(title="triage_cf", nav=_nav(pages), body=_md_to_html(readme)))
    print(f"docs: {out / 'index.html'}")
    return out / "index.html"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m triage_cf.docs", description=__doc__)
    p.add_argument("--out", default=None)
    p.add_argument("--run", action="append", default=[], help="add this run folder's report (open/synthetic datasets only)")
    p.add_argument("--notebook", action="append", default=None, help="only these notebooks (names without .ipynb)")
    a = p.parse_args(argv)
    try:
        _build(Path(a.out) if a.out else None, [Path(r) for r in a.run], a.notebook)
    except PermissionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
