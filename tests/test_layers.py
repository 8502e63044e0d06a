"""The package's layers: the import graph of `triage_cf/` has no cycle, and no module imports a `triage_cf` module
inside a function (an import inside a function hides a dependency, and a hidden one is how cycles creep in).

Each name is defined in one module (one definition per concept: a shared one is imported, two concepts get two names), and
no module imports another's private (`_`-prefixed) name: what crosses a module boundary is public.

The modules fall into the compendium's parts (`PARTS`): the shared library at the bottom, then three instruments that
never import one another: the human-triage audit, the margin probes and the transgender-bias probes. The command line
is one module per part (`cli` for the shared commands, `cli_audit`, `cli_margins`, `cli_tbias`).

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
    ("recovery", "recovery"): "recovery.run_grid: the installed module, for spawned workers",
}

#: names defined at the top level of more than one module, with the reason; each entry that is not an interface is a debt.
ALLOWED_TWICE: dict[str, str] = {
    "main": "the entry point of each command-line module (cli, docs), called by console_scripts / python -m",
    "register": "the hook each part's CLI module (cli_audit, cli_margins, cli_tbias) gives cli.py to add its subcommands",
    # debt: two samplers of one idea. The emulator's keeps a one-record stratum whole and says how it drew; the recovery
    # study's pools one-record strata of several columns. One implementation changes the recovery study's draws.
    "stratified_subsample": "emulator (training subsample, one column) and recovery (several columns); to be merged",
}


def modules() -> dict[str, ast.Module]:
    "The package's modules (name without the package prefix -> parsed source), `_modidx` excluded."
    return {p.stem: ast.parse(p.read_text(encoding="utf-8"), str(p))
            for p in sorted(PKG.glob("*.py")) if p.stem not in ("_modidx",)}


def _targets(node: ast.Import | ast.ImportFrom, module: str, known: set[str]) -> set[str]:
    "The package modules an import statement of `module` imports (relative and absolute forms)."
    out: set[str] = set()
    if isinstance(node, ast.Import):
        for a in node.names:
            parts = a.name.split(".")
            if parts[0] == NAME and len(parts) > 1:
                out.add(parts[1])
        return out
    if node.level:                                  # from .x import y / from . import x
        base = node.module.split(".")[0] if node.module else None
    elif node.module and node.module.split(".")[0] == NAME:
        parts = node.module.split(".")
        base = parts[1] if len(parts) > 1 else None
    else:
        return out
    if base:
        out.add(base)
    else:                                           # from triage_cf import synth
        out |= {a.name for a in node.names if a.name in known}
    return out


def import_edges() -> tuple[dict[str, set[str]], list[tuple[str, str, int, str]]]:
    """(graph of top-level imports: module -> package modules it imports, [(module, imported, line, function) of every
    package import inside a function or method])."""
    mods = modules()
    known = set(mods)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    inner: list[tuple[str, str, int, str]] = []

    def visit(node: ast.AST, module: str, func: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, module, getattr(child, "name", "<lambda>") if func is None else func)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for t in _targets(child, module, known) - {module}:   # a module importing itself adds no layer
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
    bad = [f"triage_cf/{m}.py:{line} ({func}) imports triage_cf.{t}" for m, t, line, func in inner
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
                bad += [f"triage_cf/{m}.py:{n.lineno} imports {a.name} from {n.module or '.'}" for a in n.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
    assert not bad, "private names imported from another module (make them public, or move them):\n" + "\n".join(bad)


#: The part of every module: the shared library (the bottom layer: data, the cohort design and g's sex-specific terms
#: that every instrument's cohort uses, the LLM layer, the chain runner, the docs), the human-triage audit (Ferré et al.,
#: the emulator and its counterfactual metrics), the margin probes (YentlGuard) and the transgender-bias probes (word
#: association and appointment allocation). A new module must be placed here.
PARTS: dict[str, str] = {
    **dict.fromkeys(["core", "governance", "llm", "data", "synth", "fetch", "rewrite", "cohort", "chain", "docs", "cli"],
                    "shared"),
    **dict.fromkeys(["split", "null_control", "emulator", "ft_launch", "baselines", "rewrite_llm", "review",
                     "counterfactuals", "predict", "metrics", "reconcile", "recovery", "plan", "report", "cli_audit"],
                    "audit"),
    **dict.fromkeys(["margins", "margins_probe", "cli_margins"], "margins"),
    **dict.fromkeys(["tbias_words", "tbias_allocation", "cli_tbias"], "tbias"),
}


def part_violations(graph: dict[str, set[str]], parts: dict[str, str]) -> list[str]:
    "Imports that cross parts the wrong way: the shared library imports only itself, an instrument only itself and shared."
    bad = []
    for m, targets in sorted(graph.items()):
        for t in sorted(targets):
            pm, pt = parts[m], parts[t]
            if pt != pm and pt != "shared":
                bad.append(f"triage_cf.{m} ({pm}) imports triage_cf.{t} ({pt})")
    return bad


def test_part_rule_on_a_hand_built_graph():
    parts = {"core": "shared", "metrics": "audit", "margins": "margins", "report": "audit"}
    assert part_violations({"core": set(), "metrics": {"core"}, "report": {"metrics", "core"}, "margins": {"core"}}, parts) == []
    assert part_violations({"core": {"metrics"}, "metrics": set(), "report": set(), "margins": {"report"}}, parts) == [
        "triage_cf.core (shared) imports triage_cf.metrics (audit)",
        "triage_cf.margins (margins) imports triage_cf.report (audit)"]


def test_every_module_has_a_part_and_parts_do_not_import_each_other():
    graph, inner = import_edges()
    unplaced = sorted(set(graph) - set(PARTS) - {"__init__"})
    assert not unplaced, f"modules without a part (add them to PARTS in tests/test_layers.py): {unplaced}"
    stale = sorted(set(PARTS) - set(graph))
    assert not stale, f"PARTS names modules that do not exist: {stale}"
    full = {m: set(t) for m, t in graph.items() if m != "__init__"}
    for m, t, _, _ in inner:
        full[m].add(t)
    bad = part_violations(full, PARTS)
    assert not bad, "imports across the compendium's parts (move the shared concept to the shared library):\n" + "\n".join(bad)


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
    bad = [f"triage_cf/{m}.py:{ln} imports {t} inside a function" for m, t, ln in third_party_imports_in_functions()
           if t in core and t not in LAZY_REQUIREMENTS]
    assert not bad, ("core requirements imported inside functions (import them at the top of the module; only optional "
                     "heavy packages stay lazy):\n" + "\n".join(bad))
    stale = sorted(set(LAZY_REQUIREMENTS) - {t for _, t, _ in third_party_imports_in_functions()})
    assert not stale, f"LAZY_REQUIREMENTS lists packages that no module imports inside a function: {stale}"
