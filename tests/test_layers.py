"""The package's layers: the import graph of `triage_cf/` has no cycle, and no module imports a `triage_cf` module
inside a function (an import inside a function hides a dependency, and a hidden one is how cycles creep in).

Each name is defined in one module (one definition per concept: a shared one is imported, two concepts get two names), and
no module imports another's private (`_`-prefixed) name: what crosses a module boundary is public.

The package is the compendium's parts: the shared library at its top level (the bottom layer), and one subpackage per
instrument (`audit`: the human-triage audit; `margins`: the margin probes; `tbias`: the transgender-bias probes) that
never imports another. The command line is one module per part (`cli` for the shared commands, `audit.cli`,
`margins.cli`, `tbias.cli`). The notebooks mirror it: `nbs/<k>_<part>/` holds a part's library chapters (numbered in
reading order, each exporting into its part) and `nbs/<k>_<part>/stages/` its thin stage notebooks (named and numbered
in the chain's run order); no library chapter holds a stage tail.

The core requirements (settings.ini `requirements`) are imported at the top of a module, where a reader sees what it
needs; only the optional heavy packages (the `llm`, `gpu` and `llamacpp` extras, vLLM, the model packages) and the few
core ones named in `LAZY_REQUIREMENTS` (with the measured reason) are imported inside the functions that use them.

Only the standard library's `ast` reads the sources: nothing is imported, so the test also holds for modules whose
optional heavy dependencies (torch, transformers, vllm...) are not installed."""
from __future__ import annotations

import ast
import configparser
import re
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "triage_cf"
NAME = PKG.name

#: (module, imported module) pairs still imported inside a function, with the reason; each entry is a debt to pay.
ALLOWED_IN_FUNCTION: dict[tuple[str, str], str] = {
    # the spawned workers of the recovery grid must run the installed module's function: in the notebook, run_grid's
    # own module is __main__, which a spawned process cannot import
    ("audit.recovery", "audit.recovery"): "audit.recovery.run_grid: the installed module, for spawned workers",
}

#: names defined at the top level of more than one module, with the reason; each entry that is not an interface is a debt.
ALLOWED_TWICE: dict[str, str] = {
    "main": "the entry point of each command-line module (cli, docs), called by console_scripts / python -m",
    "register": "the hook each part's CLI module (audit.cli, margins.cli, tbias.cli) gives cli.py to add its subcommands",
}


#: The subpackages of the instruments; every other module is the shared library (the package's top level).
INSTRUMENTS = ("audit", "margins", "tbias")


def module_name(path: Path) -> str:
    "A source file's module name without the package prefix: `core`, `audit.emulator`; a subpackage's `__init__` is `audit`."
    parts = list(path.relative_to(PKG).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, ast.Module]:
    "The package's modules (dotted name without the package prefix -> parsed source), `_modidx` excluded."
    return {module_name(p): ast.parse(p.read_text(encoding="utf-8"), str(p))
            for p in sorted(PKG.rglob("*.py")) if p.stem != "_modidx" and "__pycache__" not in p.parts
            and "resources" not in p.relative_to(PKG).parts}


def _package_of(module: str, is_package: bool) -> list[str]:
    "The package a module's relative imports start from, as a list of components ([] = the top of triage_cf)."
    parts = module.split(".") if module != "__init__" else []
    return parts if is_package else parts[:-1]


def _targets(node: ast.Import | ast.ImportFrom, module: str, known: set[str], is_package: bool = False) -> set[str]:
    "The package modules an import statement of `module` imports (relative and absolute forms, any depth)."
    out: set[str] = set()
    if isinstance(node, ast.Import):
        for a in node.names:
            parts = a.name.split(".")
            if parts[0] == NAME and len(parts) > 1:
                out.add(".".join(parts[1:]))
        return {t for t in out if t in known} | {t.rsplit(".", 1)[0] for t in out if t not in known and "." in t}
    if node.level:                                  # from .x import y / from ..x import y / from . import x
        base = _package_of(module, is_package)
        base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
        prefix = base + (node.module.split(".") if node.module else [])
    elif node.module and node.module.split(".")[0] == NAME:
        prefix = node.module.split(".")[1:]
    else:
        return out
    name = ".".join(prefix)
    for a in node.names:                            # from triage_cf.audit import emulator: a module, not a name
        sub = f"{name}.{a.name}" if name else a.name
        if sub in known:
            out.add(sub)
        elif name in known:
            out.add(name)
    return out


def import_edges() -> tuple[dict[str, set[str]], list[tuple[str, str, int, str]]]:
    """(graph of top-level imports: module -> package modules it imports, [(module, imported, line, function) of every
    package import inside a function or method])."""
    mods = modules()
    known = set(mods)
    packages = {module_name(p) for p in PKG.rglob("__init__.py")}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    inner: list[tuple[str, str, int, str]] = []

    def visit(node: ast.AST, module: str, func: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, module, getattr(child, "name", "<lambda>") if func is None else func)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for t in _targets(child, module, known, module in packages) - {module}:   # a module importing itself adds no layer
                    if func is None:
                        graph[module].add(t)
                    else:
                        inner.append((module, t, child.lineno, func))
            visit(child, module, func)

    for m, tree in mods.items():
        visit(tree, m, None)
    return graph, inner


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    "One cycle of `graph` as [a, b, ..., a], or None (depth-first search, deterministic order)."
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(u: str) -> list[str] | None:
        state[u] = 1
        stack.append(u)
        for v in sorted(graph.get(u, ())):
            if state.get(v) == 1:
                return stack[stack.index(v):] + [v]
            if not state.get(v) and (c := dfs(v)):
                return c
        stack.pop()
        state[u] = 2
        return None

    for u in sorted(graph):
        if not state.get(u) and (c := dfs(u)):
            return c
    return None


def test_cycle_finder_finds_a_cycle_and_accepts_a_dag():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"core": set(), "data": {"core"}, "chain": {"core", "data"}}) is None


def test_targets_read_every_import_form():
    known = {"core", "synth", "data"}
    src = ("import triage_cf.core\nfrom triage_cf import synth\nfrom .data import x\nfrom triage_cf.core import y\n"
           "import numpy\nfrom . import synth as s\n")
    got = [_targets(n, "m", known) for n in ast.parse(src).body]
    assert got == [{"core"}, {"synth"}, {"data"}, {"core"}, set(), {"synth"}]
    # inside a part's subpackage: two-dot imports reach the shared library, one-dot ones the part
    known = {"core", "audit", "audit.metrics", "audit.report"}
    src = ("from ..core import x\nfrom .metrics import y\nfrom triage_cf.audit import metrics\nimport triage_cf.audit.metrics\n"
           "from triage_cf.audit.metrics import z\n")
    got = [_targets(n, "audit.report", known) for n in ast.parse(src).body]
    assert got == [{"core"}, {"audit.metrics"}, {"audit.metrics"}, {"audit.metrics"}, {"audit.metrics"}]
    assert [_targets(n, "audit", known, is_package=True) for n in ast.parse("from .metrics import y\n").body] == [{"audit.metrics"}]


def test_core_is_the_bottom_layer():
    graph, _ = import_edges()
    assert graph["core"] == set(), f"triage_cf.core imports {sorted(graph['core'])}: core must import no package module"
    assert graph["governance"] <= {"core"}, f"triage_cf.governance may import core only, imports {sorted(graph['governance'])}"


def test_import_graph_has_no_cycle():
    graph, inner = import_edges()
    # an import inside a function is still a dependency: the graph with them must be acyclic too
    full = {m: set(t) for m, t in graph.items()}
    for m, t, _, _ in inner:
        full[m].add(t)
    for g, what in ((graph, "top-level imports"), (full, "imports, including those inside functions")):
        cycle = find_cycle(g)
        assert cycle is None, f"import cycle among the {what} of triage_cf: {' -> '.join(cycle)}"


def test_no_package_import_inside_a_function():
    _, inner = import_edges()
    bad = [f"triage_cf/{m.replace('.', '/')}.py:{line} ({func}) imports triage_cf.{t}" for m, t, line, func in inner
           if (m, t) not in ALLOWED_IN_FUNCTION]
    assert not bad, ("package imports inside functions (move them to the module's top; only heavy optional third-party "
                     "dependencies may be imported inside a function):\n" + "\n".join(bad))


def test_allowlist_has_no_stale_entry():
    "An allowlisted import that is gone must leave the allowlist (so the list only shrinks)."
    _, inner = import_edges()
    used = {(m, t) for m, t, _, _ in inner}
    mods = modules()
    used |= {(m, m) for m, tree in mods.items() for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
             and m in _targets(n, m, set(mods))}
    stale = sorted(set(ALLOWED_IN_FUNCTION) - used)
    assert not stale, f"ALLOWED_IN_FUNCTION lists imports that no longer happen inside a function: {stale}"


def top_level_names(tree: ast.Module) -> set[str]:
    "Names a module defines at its top level (functions, classes, assignments); dunders such as `__all__` left out."
    out: set[str] = set()
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.Assign):
            out |= {t.id for t in n.targets if isinstance(t, ast.Name)}
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            out.add(n.target.id)
    return {x for x in out if not x.startswith("__")}


def defined_twice() -> dict[str, list[str]]:
    "Name -> the modules that define it, for every name defined at the top level of more than one module."
    where: dict[str, list[str]] = {}
    for m, tree in modules().items():
        for name in top_level_names(tree):
            where.setdefault(name, []).append(m)
    return {k: sorted(v) for k, v in where.items() if len(v) > 1}


def test_top_level_names_read_defs_and_assignments():
    tree = ast.parse("X = 1\nY: int = 2\n__all__ = []\ndef f(): Z = 3\nclass C: W = 4\n_p = 5\n")
    assert top_level_names(tree) == {"X", "Y", "f", "C", "_p"}


def test_no_name_defined_twice():
    bad = {k: v for k, v in defined_twice().items() if k not in ALLOWED_TWICE}
    assert not bad, ("names defined in more than one module (import the one definition, or give the two concepts two "
                     "names):\n" + "\n".join(f"{k}: {', '.join(v)}" for k, v in sorted(bad.items())))
    stale = sorted(set(ALLOWED_TWICE) - set(defined_twice()))
    assert not stale, f"ALLOWED_TWICE lists names that are now defined once: {stale}"


def test_no_private_name_crosses_a_module():
    mods = modules()
    bad = []
    for m, tree in mods.items():
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and _targets(n, m, set(mods)) - {m}:
                bad += [f"triage_cf/{m.replace('.', '/')}.py:{n.lineno} imports {a.name} from {n.module or '.'}" for a in n.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
    assert not bad, "private names imported from another module (make them public, or move them):\n" + "\n".join(bad)


def part_of(module: str) -> str:
    """The compendium's part of a module: the subpackage of an instrument (`audit`: the human-triage audit of the paper,
    the emulator and its counterfactual metrics; `margins`: the margin probes of YentlGuard; `tbias`: the
    transgender-bias probes of Hirsch et al.), else `shared`: the shared library at the package's top level (data, the
    cohort design and g's sex-specific terms that every instrument's cohort uses, the LLM layer, the chain runner, the
    docs, the shared commands)."""
    head = module.split(".")[0]
    return head if head in INSTRUMENTS else "shared"


def part_violations(graph: dict[str, set[str]]) -> list[str]:
    "Imports that cross parts the wrong way: the shared library imports only itself, an instrument only itself and shared."
    bad = []
    for m, targets in sorted(graph.items()):
        for t in sorted(targets):
            pm, pt = part_of(m), part_of(t)
            if pt != pm and pt != "shared":
                bad.append(f"triage_cf.{m} ({pm}) imports triage_cf.{t} ({pt})")
    return bad


def test_part_rule_on_a_hand_built_graph():
    ok = {"core": set(), "audit.metrics": {"core"}, "audit.report": {"audit.metrics", "core"}, "margins.probe": {"core"}}
    assert part_violations(ok) == []
    assert part_violations({"core": {"audit.metrics"}, "audit.metrics": set(), "audit.report": set(),
                            "margins.probe": {"audit.report"}}) == [
        "triage_cf.core (shared) imports triage_cf.audit.metrics (audit)",
        "triage_cf.margins.probe (margins) imports triage_cf.audit.report (audit)"]


def test_the_package_is_the_parts_and_parts_do_not_import_each_other():
    graph, inner = import_edges()
    assert {m for m in graph if "." not in m and m in INSTRUMENTS} == set(INSTRUMENTS), \
        f"one subpackage per instrument expected: {INSTRUMENTS}"
    deep = sorted(m for m in graph if m.count(".") > 1)
    assert not deep, f"modules nested below a part's subpackage: {deep}"
    full = {m: set(t) for m, t in graph.items()}
    for m, t, _, _ in inner:
        full[m].add(t)
    bad = part_violations(full)
    assert not bad, "imports across the compendium's parts (move the shared concept to the shared library):\n" + "\n".join(bad)
    # the shared library is the bottom layer: no shared module imports an instrument (checked above), and the CLI's
    # one module per part is found by cli.py
    for part in INSTRUMENTS:
        assert f"{part}.cli" in graph, f"the {part} part has no command-line module triage_cf/{part}/cli.py"


#: Where the notebooks live: `nbs/<k>_<part>/` (k orders the parts for a reader: the shared library first), the library
#: chapters at the top of a part's folder, its stage notebooks in `nbs/<k>_<part>/stages/`.
NBS = PKG.parent / "nbs"
PART_FOLDERS = {"shared": "0_shared", "audit": "1_audit", "margins": "2_margins", "tbias": "3_tbias"}
#: The line budget of a stage notebook: code lines (blank and comment-only lines not counted) in all its code cells, and
#: in any one of them. A stage notebook holds its parameters, calls into the library and the stage's outputs; the
#: method (functions, classes, their tests) is in the part's library chapters.
#: (150 and 60 before the stages' decisions moved into the chapters: model and null discovery, level tests, the
#: baselines' training records and nulls, the recovery study's truths and power.)
STAGE_CODE_LINES = 125
STAGE_CELL_LINES = 40
#: Functions still defined in a stage notebook, with the reason; each is a debt (move it into the part's library).
STAGE_DEFINITIONS: dict[tuple[str, str], str] = {}


def _cells(path: Path) -> list[dict]:
    import json
    return [{**c, "source": "".join(c["source"]) if isinstance(c["source"], list) else c["source"]}
            for c in json.loads(path.read_text(encoding="utf-8"))["cells"]]


def chapters() -> list[Path]:
    return sorted(p for p in NBS.glob("*/*.ipynb"))


def stage_notebooks() -> list[Path]:
    return sorted(NBS.glob("*/stages/*.ipynb"))


def _code_lines(src: str) -> int:
    return sum(1 for line in src.splitlines() if line.strip() and not line.strip().startswith("#"))


def test_notebooks_are_in_part_folders_that_mirror_the_package():
    stray = sorted(str(p.relative_to(NBS)) for p in NBS.rglob("*.ipynb") if p.name != "index.ipynb"
                   and p.parent.name != ".ipynb_checkpoints"
                   and not (p.parent.name in PART_FOLDERS.values() or (p.parent.name == "stages"
                                                                      and p.parent.parent.name in PART_FOLDERS.values())))
    assert not stray, f"notebooks outside nbs/<part>/ and nbs/<part>/stages/: {stray}"
    for path in chapters():
        part = {v: k for k, v in PART_FOLDERS.items()}[path.parent.name]
        exp = [re.match(r"#\| default_exp (\S+)", c["source"]) for c in _cells(path) if c["cell_type"] == "code"]
        exp = [m.group(1) for m in exp if m]
        assert len(exp) == 1, f"{path.relative_to(NBS)}: a library chapter has one default_exp, found {exp}"
        assert part_of(exp[0]) == part and exp[0].count(".") == (part != "shared"), \
            f"{path.relative_to(NBS)} exports triage_cf.{exp[0]}: a chapter of {path.parent.name}/ exports into its part's " \
            f"{'top level' if part == 'shared' else 'subpackage triage_cf.' + part}"
    names = [p.stem for p in stage_notebooks()]
    assert len(names) == len(set(names)), f"stage names must be unique across the parts: {sorted(names)}"
    for folder in PART_FOLDERS.values():
        stems = [p.stem for p in sorted((NBS / folder).glob("*.ipynb"))]
        nums = [int(s.split("_", 1)[0]) for s in stems]
        assert nums == list(range(len(stems))), f"nbs/{folder}/: chapters numbered 00, 01, ... in reading order, got {stems}"


def test_a_chapter_uses_only_the_chapters_before_it():
    "Reading order is dependency order: a chapter's module imports only earlier chapters of its part, and the shared library."
    graph, inner = import_edges()
    full = {m: set(t) for m, t in graph.items()}
    for m, t, _, _ in inner:
        full[m].add(t)
    bad, modules_of_chapters = [], _chapter_modules()
    for folder in PART_FOLDERS.values():
        seen: set[str] = set()
        for path in sorted((NBS / folder).glob("*.ipynb")):
            mod = next(m.group(1) for c in _cells(path) if (m := re.match(r"#\| default_exp (\S+)", c["source"])))
            later = sorted(t for t in full.get(mod, ()) if t in modules_of_chapters and part_of(t) == part_of(mod)
                           and t not in seen)
            bad += [f"{path.relative_to(NBS)} (triage_cf.{mod}) imports triage_cf.{t}, a later chapter" for t in later]
            seen.add(mod)
    assert not bad, "chapters out of dependency order (renumber them):\n" + "\n".join(bad)


def _chapter_modules() -> set[str]:
    "The modules exported by library chapters (the hand-written glue modules are not chapters)."
    out = set()
    for path in chapters():
        out |= {m.group(1) for c in _cells(path) if (m := re.match(r"#\| default_exp (\S+)", c["source"]))}
    return out


def test_no_library_chapter_holds_a_stage_tail():
    bad = []
    for path in chapters():
        for c in _cells(path):
            # a call of stage_setup (the chain chapter defines it: `def stage_setup(` is not a call)
            if "parameters" in c.get("metadata", {}).get("tags", []) or re.search(r"(?<!def )\bstage_setup\(",
                                                                                   c["source"]):
                bad.append(f"{path.relative_to(NBS)} cell {c.get('id')}")
    assert not bad, "library chapters with a stage tail (a parameters cell or stage_setup): move it to the part's stages/:\n" \
        + "\n".join(bad)


def test_stage_notebooks_are_thin():
    from triage_cf.chain import STAGES
    assert sorted(p.stem for p in stage_notebooks()) == sorted(STAGES), "one notebook per stage of chain.STAGES"
    assert STAGES == sorted(STAGES), "stages are numbered in run order"
    bad, defs = [], set()
    for path in stage_notebooks():
        code = [c for c in _cells(path) if c["cell_type"] == "code"]
        where = path.relative_to(NBS)
        if sum(1 for c in code if "parameters" in c.get("metadata", {}).get("tags", [])) != 1:
            bad.append(f"{where}: one parameters cell expected")
        if any(c["source"].lstrip().startswith(("#| export", "#| exports", "#| default_exp")) for c in code):
            bad.append(f"{where}: export cells belong to a library chapter")
        total = sum(_code_lines(c["source"]) for c in code)
        if total > STAGE_CODE_LINES:
            bad.append(f"{where}: {total} code lines > {STAGE_CODE_LINES}")
        for c in code:
            if _code_lines(c["source"]) > STAGE_CELL_LINES:
                bad.append(f"{where} cell {c.get('id')}: {_code_lines(c['source'])} code lines > {STAGE_CELL_LINES}")
            src = "\n".join(line for line in c["source"].splitlines() if not line.lstrip().startswith(("%", "!")))
            for n in ast.walk(ast.parse(src)):
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    defs.add((path.stem, n.name))
                    if (path.stem, n.name) not in STAGE_DEFINITIONS:
                        bad.append(f"{where}: defines {n.name} (the method belongs in the part's library chapter)")
                if isinstance(n, ast.ImportFrom) and (n.module or "").startswith(NAME):
                    bad += [f"{where}: imports the private {a.name} from {n.module}" for a in n.names
                            if a.name.startswith("_")]
    assert not bad, "stage notebooks that are not thin:\n" + "\n".join(bad)
    stale = sorted(set(STAGE_DEFINITIONS) - defs)
    assert not stale, f"STAGE_DEFINITIONS lists definitions that are gone: {stale}"


#: Import names of distributions whose module name differs from the distribution's.
IMPORT_NAMES = {"scikit-learn": "sklearn", "pyyaml": "yaml", "opentelemetry-sdk": "opentelemetry",
                "opentelemetry-exporter-otlp-proto-http": "opentelemetry"}
#: Core requirements that stay inside functions, with the reason (import times measured on the 2-core machine: each
#: would otherwise be paid by `triage-cf --help` and by every `import triage_cf.<module>` that does not use it).
LAZY_REQUIREMENTS: dict[str, str] = {
    "papermill": "notebook execution (1.4 s to import): only the chain runner and the docs build execute notebooks",
    "nbconvert": "HTML rendering (1.5 s): only publishing a stage's notebook and the docs build render",
    "nbformat": "notebook files (1.3 s): only where a notebook is read or written",
    "spacy": "g's morphological analyser (1.6 s, and loading a pipeline more): g's rules work without it",
}


def core_requirements() -> set[str]:
    "Top-level import names of settings.ini's `requirements`."
    cfg = configparser.ConfigParser()
    cfg.read(PKG.parent / "settings.ini")
    out = set()
    for req in cfg["DEFAULT"]["requirements"].split():
        dist = re.split(r"[<>=!\[ ;]", req, maxsplit=1)[0].lower()
        out.add(IMPORT_NAMES.get(dist, dist.replace("-", "_")))
    return out


def third_party_imports_in_functions() -> list[tuple[str, str, int]]:
    "(module, imported top-level package, line) of every non-package, non-stdlib import inside a function."
    out = []

    def visit(node, module, in_func):
        for child in ast.iter_child_nodes(node):
            f = in_func or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if in_func and isinstance(child, ast.Import):
                out.extend((module, a.name.split(".")[0], child.lineno) for a in child.names)
            elif in_func and isinstance(child, ast.ImportFrom) and not child.level and child.module:
                out.append((module, child.module.split(".")[0], child.lineno))
            visit(child, module, f)

    for m, tree in modules().items():
        visit(tree, m, False)
    return [(m, t, ln) for m, t, ln in out if t != NAME and t not in sys.stdlib_module_names]


def test_core_requirements_are_imported_at_module_level():
    core = core_requirements()
    assert {"sklearn", "yaml", "scipy", "matplotlib", "statsmodels", "tqdm", "papermill"} <= core
    bad = [f"triage_cf/{m.replace('.', '/')}.py:{ln} imports {t} inside a function" for m, t, ln in third_party_imports_in_functions()
           if t in core and t not in LAZY_REQUIREMENTS]
    assert not bad, ("core requirements imported inside functions (import them at the top of the module; only optional "
                     "heavy packages stay lazy):\n" + "\n".join(bad))
    stale = sorted(set(LAZY_REQUIREMENTS) - {t for _, t, _ in third_party_imports_in_functions()})
    assert not stale, f"LAZY_REQUIREMENTS lists packages that no module imports inside a function: {stale}"


# The chapters' budgets: cells a newcomer can change. Measured over every notebook of nbdev and fastcore themselves
# (the house style's references): export cells of median 11 and 7 lines, longest 70 and 56, about 1 definition per
# cell, 1.3-1.4% of lines over 120 characters, and no package function over 53 lines.
#: Export cells (code cells starting `#| export`, `#| exporti`, `#| exports`): lines other than `#|` directives.
EXPORT_CELL_MEDIAN = 12
EXPORT_CELL_MAX = 50
#: Characters in any line of an export cell.
EXPORT_LINE_MAX = 120
#: Lines of any function or method of the package (`def` to its last line, decorators aside), hand-written or exported.
FUNCTION_MAX = 60
#: Modules of the package that no library chapter exports, with the reason; every other module is a chapter's.
HAND_WRITTEN: dict[str, str] = {
    "audit.ft_launch": "the script `accelerate launch` starts in every process of a multi-GPU fine-tune: accelerate "
                       "runs a file path, so it is a file; it parses the settings file and calls "
                       "`triage_cf.audit.emulator`'s tested functions (chapter 02_emulator documents it)",
}


def export_cells() -> list[tuple[str, str, list[str], str]]:
    "(chapter, cell id, lines without the `#|` directives, source) of every export cell of the library chapters."
    out = []
    for path in chapters():
        for c in _cells(path):
            src = c["source"]
            if c["cell_type"] == "code" and re.match(r"#\| ?export[is]?\b", src.lstrip()):
                out.append((str(path.relative_to(NBS)), c.get("id"), [x for x in src.splitlines()
                                                                      if not x.startswith("#|")], src))
    return out


def test_export_cells_are_small():
    cells = export_cells()
    sizes = sorted(len(body) for _, _, body, _ in cells)
    median = sizes[len(sizes) // 2] if len(sizes) % 2 else (sizes[len(sizes) // 2 - 1] + sizes[len(sizes) // 2]) / 2
    assert len(cells) > 500 and median <= EXPORT_CELL_MEDIAN, f"median export cell: {median} lines > {EXPORT_CELL_MEDIAN}"
    big = [f"{nb} {cid}: {len(body)} lines" for nb, cid, body, _ in cells if len(body) > EXPORT_CELL_MAX]
    assert not big, f"export cells over {EXPORT_CELL_MAX} lines (split them, one concept each):\n" + "\n".join(big)


def test_export_cell_lines_are_short():
    long = [f"{nb} {cid}: {len(x)} characters: {x.strip()[:60]}" for nb, cid, body, _ in export_cells()
            for x in body if len(x) > EXPORT_LINE_MAX]
    assert not long, f"export-cell lines over {EXPORT_LINE_MAX} characters:\n" + "\n".join(long)


def test_one_definition_per_export_cell():
    bad = []
    for nb, cid, _, src in export_cells():
        defs = [n.name for n in ast.parse(src).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                        ast.ClassDef))]
        if len(defs) > 1:
            bad.append(f"{nb} {cid}: {', '.join(defs)}")
    assert not bad, "export cells that bundle several definitions (one concept per cell, its example after it):\n" + \
        "\n".join(bad)


def long_functions(tree: ast.Module, limit: int) -> list[tuple[str, int]]:
    "(name, lines) of every function or method of `tree` longer than `limit` lines."
    return [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > limit]


def test_long_functions_are_found():
    tree = ast.parse("def f():\n" + "    x = 1\n" * 61 + "\ndef g():\n    return 1\n")
    assert long_functions(tree, FUNCTION_MAX) == [("f", 62)] and long_functions(tree, 100) == []


def test_no_function_over_the_budget():
    bad = [f"triage_cf/{m.replace('.', '/')}.py: {name} ({n} lines)" for m, tree in modules().items()
           for name, n in long_functions(tree, FUNCTION_MAX)]
    assert not bad, f"functions over {FUNCTION_MAX} lines (split them into named steps):\n" + "\n".join(bad)


def test_every_module_is_a_chapter_or_says_why_not():
    files = [p for p in sorted(PKG.rglob("*.py")) if p.stem not in ("_modidx", "__init__")
             and "__pycache__" not in p.parts and "resources" not in p.relative_to(PKG).parts]
    hand = {module_name(p) for p in files if "AUTOGENERATED! DO NOT EDIT!" not in p.read_text(encoding="utf-8")[:400]}
    assert hand == set(HAND_WRITTEN), (f"hand-written modules without a reason in HAND_WRITTEN: "
                                       f"{sorted(hand - set(HAND_WRITTEN))}; listed but generated or gone: "
                                       f"{sorted(set(HAND_WRITTEN) - hand)}")
