"""The chain runner: executes the declared stage notebooks in order with papermill (hand-written glue, not a stage).

A stage is skipped when its notebook, its parameters, the package code and every earlier stage are unchanged since
its last successful run and all the artifacts it wrote are still there with the same sha256 (recorded in run.json).
Once one stage runs, every later stage runs too. A failing stage stops the chain; run.json records it as failed.

Crashes: a killed (or failed) stage is re-run from the top of its notebook, and the notebook resumes from the durable
work it left (fine-tuning checkpoints, prediction chunks: atomic writes, so never half-written); that work counts among
the stage's outputs in run.json. Before a stage re-runs, every artifact of its last successful run whose sha256 no longer
matches run.json (truncated, corrupted) is moved to `data/_quarantine/`, so that the stage recomputes it and never reads
it. The stage kernels get `PYTHONHASHSEED` = the run's seed (tests/test_crash_resume.py, tests/test_reproducible.py).

Data protection (triage_cf.governance): papermill executes a stage into `data/_executed/<stage>.ipynb` (the run
folder's record-level area, never rendered). Only after the scanner has checked that notebook, its HTML and every
rendered file of the run folder against the run's records is the notebook moved to `notebooks/` and its HTML written
to `html/`. For a credentialed or restricted dataset a finding fails the stage (naming the output and the cell) and
nothing of it is rendered; for open and synthetic datasets findings are recorded in run.json (report-only).
"""
from __future__ import annotations

import ast
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import yaml
from filelock import FileLock

from .core import (CHAIN_ENV, RunPaths, atomic_write_text, load_params, read_yaml, repo_root, run_dir_for, seed_everything,
                   sha256_file, sha256_text, write_json)
from .governance import (RenderBlocked, install_display_policy, policy_for_dataset, policy_for_run, publish_notebook,
                         sanitize_message)

#: The ordered stage list of the chain, numbered in run order (a stage is named by its notebook, `nbs/<part>/stages/`):
#: the shared data and cohort stages (01-02), the human-triage audit (03-10), the probes of an LLM's own behaviour
#: (11-12 margins, 13-14 transgender bias), then the report (15_report, always last, so that it shows what every earlier
#: stage wrote).
STAGES: list[str] = ["01_data", "02_cohort", "03_split", "04_null_control", "05_emulator", "06_baselines", "07_counterfactuals", "08_predict", "09_metrics",
                     "10_recovery", "11_margins_vignettes", "12_margins_probe", "13_tbias_words", "14_tbias_allocation", "15_report"]
#: Stages that run only when the profile turns them on (parameter name -> truthy): the planted-bias recovery study
#: trains several emulators and belongs to the `calibration` profile, not to `make reproduce`; the token-margin probes
#: (YentlGuard) and the transgender-bias tasks (Hirsch et al.) are instruments of their own, run by their profiles; the null
#: control (permuted-sex training records for null twins of the emulators) runs where the profile sets `null_control`.
OPTIONAL_STAGES: dict[str, str] = {"04_null_control": "null_control", "10_recovery": "recovery_study", "11_margins_vignettes": "probe_margins",
                                   "12_margins_probe": "probe_margins", "13_tbias_words": "transgender_bias",
                                   "14_tbias_allocation": "transgender_bias"}


#: Run folders' layout: 2 since nbs/ is in part folders and the stages are named in run order, one name per instrument.
RUN_LAYOUT = 2
#: The stages renamed then (layout 1 -> 2); `01_data`, `02_cohort` and `03_split` kept their names.
RENAMED_STAGES: dict[str, str] = {"03e_null_control": "04_null_control", "04_emulator": "05_emulator",
                                  "04b_baselines": "06_baselines", "05_counterfactuals": "07_counterfactuals",
                                  "06_predict": "08_predict", "07_metrics": "09_metrics", "08_recovery": "10_recovery",
                                  "10_vignettes": "11_margins_vignettes", "11_margins": "12_margins_probe",
                                  "12_word_association": "13_tbias_words", "13_allocation": "14_tbias_allocation",
                                  "09_report": "15_report"}


def _unknown_stages(names: list[str], where: str) -> ValueError:
    "The error for stage names that are not stages, naming the new name of a renamed one."
    hints = [f"{n!r} is now {RENAMED_STAGES[n]!r}" for n in names if n in RENAMED_STAGES]
    return ValueError(f"{where}: unknown stages {names}" + (f" ({'; '.join(hints)}: the stages were renamed in run order "
                      "when nbs/ moved into part folders)" if hints else "") + f"; stages: {STAGES}")


def stages_for(params: dict) -> list[str]:
    """The chain's stages under `params`: a profile's `stages` list when it has one (run in chain order; an instrument
    that needs no emulator runs only what it reads), else every stage but the optional ones whose switch is off."""
    if params.get("stages"):
        unknown = [s for s in params["stages"] if s not in STAGES]
        if unknown:
            raise _unknown_stages(unknown, f"profile {params.get('profile')!r}")
        return [s for s in STAGES if s in params["stages"]]
    return [s for s in STAGES if s not in OPTIONAL_STAGES or params.get(OPTIONAL_STAGES[s])]

#: Files of the run folder that are bookkeeping, not stage artifacts.
_BOOKKEEPING = {"run.json", ".lock"}
#: Folders of the run folder's data/ area that are bookkeeping: unscanned executions and quarantined outputs.
_BOOKKEEPING_DIRS = {("data", "_executed"), ("data", "_quarantine")}

#: Packages whose versions run.json records.
_PACKAGES = ["triage_cf", "numpy", "pandas", "pyarrow", "pandera", "scikit-learn", "scipy", "statsmodels",
             "matplotlib", "seaborn", "papermill", "nbconvert", "torch", "transformers", "peft", "accelerate"]


class StageFailed(RuntimeError):
    "A stage notebook raised; the message names the stage, the cell and the error."


@dataclass
class StageResult:
    stage: str
    status: str  # "ran" | "skipped" | "failed"
    wall_s: float


def stage_notebook(stage: str) -> Path:
    """The stage's notebook: `nbs/<part>/stages/<stage>.ipynb` (a stage is named by its notebook's stem, unique across
    the parts)."""
    found = sorted((repo_root() / "nbs").glob(f"*/stages/{stage}.ipynb"))
    if len(found) != 1:
        raise FileNotFoundError(f"stage {stage!r}: expected one notebook nbs/<part>/stages/{stage}.ipynb, found {len(found)}")
    return found[0]


def _notebook_fingerprint(path: Path) -> str:
    "sha256 of the notebook's cell sources and types (outputs and metadata ignored)."
    nb = json.loads(path.read_text(encoding="utf-8"))
    cells = [[c["cell_type"], "".join(c["source"]) if isinstance(c["source"], list) else c["source"]] for c in nb["cells"]]
    return sha256_text(json.dumps(cells))


def _code_fingerprint() -> str:
    "sha256 over the package's source files: any code change invalidates every stage."
    pkg = Path(__file__).resolve().parent
    h = [f"{p.relative_to(pkg)}:{sha256_file(p)}" for p in sorted(pkg.rglob("*")) if p.is_file() and p.suffix in {".py", ".yaml", ".txt", ".json", ".tsv", ".csv"} and "__pycache__" not in p.parts]
    return sha256_text("\n".join(h))


def _notebook_parameters(path: Path) -> set[str]:
    import papermill as pm
    return set(pm.inspect_notebook(str(path)).keys())


def parse_overrides(items: list[str] | None) -> dict:
    """Parameters from the command line's `--set KEY=VALUE` (VALUE read as YAML 1.2, as params files: `--set ft_num_processes=2`,
    `--set ft_lr=1e-3`, `--set ft_eval_views=[full]`, `--set ft_train_n=null`); a malformed item raises ValueError naming it."""
    out: dict = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not key.strip().isidentifier():
            raise ValueError(f"--set {item!r}: expected KEY=VALUE with KEY a parameter name, e.g. --set ft_num_processes=2")
        try:
            out[key.strip()] = read_yaml(value) if value.strip() else None
        except yaml.YAMLError as exc:
            raise ValueError(f"--set {item!r}: VALUE is not valid YAML ({exc.__class__.__name__})") from None
    return out


def notebook_defaults(stages: list[str]) -> dict[str, dict]:
    """{parameter: {stage: default}} of the `stages`' `parameters` cells: what a stage runs with where the profile
    leaves a key unset (literal defaults only; `triage-cf plan` reads them so that its sizes are the chain's)."""
    import papermill as pm
    out: dict[str, dict] = {}
    for s in stages:
        nb = stage_notebook(s)
        if not nb.exists():
            continue
        for k, v in pm.inspect_notebook(str(nb)).items():
            try:
                out.setdefault(k, {})[s] = ast.literal_eval(v["default"])
            except (ValueError, SyntaxError):
                pass
    return out


def _git_commit() -> dict:
    root = repo_root()
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True).stdout.strip())
    except Exception:
        commit, dirty = None, None
    return {"commit": commit, "dirty": dirty}


def _package_versions() -> dict:
    out = {"python": platform.python_version()}
    for p in _PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            pass
    return out


def _outputs_since(paths: RunPaths, start_ns: int, exclude: set[str] = frozenset()) -> dict[str, str]:
    """Artifacts (relative path -> sha256) written in the run folder since `start_ns`, except the paths in `exclude`.

    Temporary files and folders of atomic writes (a name starting with "." or ending with ".tmp", e.g. the half-written
    checkpoint folder of a killed fine-tune) are not artifacts."""
    out = {}
    for p in sorted(paths.root.rglob("*")):
        if not p.is_file() or p.name in _BOOKKEEPING or p.name.endswith(".tmp"):
            continue
        rel = p.relative_to(paths.root)
        if any(part.startswith(".") for part in rel.parts) or tuple(rel.parts[:2]) in _BOOKKEEPING_DIRS:
            continue
        if str(rel) not in exclude and p.stat().st_mtime_ns >= start_ns:
            out[str(rel)] = sha256_file(p)
    return out


def _outputs_intact(paths: RunPaths, outputs: dict[str, str]) -> bool:
    for rel, sha in outputs.items():
        p = paths.root / rel
        if not p.is_file() or sha256_file(p) != sha:
            return False
    return True


def _quarantine_corrupt(paths: RunPaths, outputs: dict[str, str]) -> list[str]:
    """Move the artifacts of `outputs` whose sha256 differs from the recorded one to `data/_quarantine/` (same relative
    path) before their stage runs again, so that the stage recomputes them and never reads them (a stage's durable chunks
    and checkpoints are reused when present). Returns the moved paths."""
    moved = []
    for rel, sha in sorted(outputs.items()):
        p = paths.root / rel
        if p.is_file() and sha256_file(p) != sha:
            dst = paths.data / "_quarantine" / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(p, dst)
            moved.append(rel)
    return moved


def load_run_json(paths: RunPaths) -> dict:
    if paths.run_json.exists():
        try:
            return json.loads(paths.run_json.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            return {}
    return {}


def migrate_run_folder(paths: RunPaths, run: dict) -> list[str]:
    """Bring a run folder written before the part folders (run.json without `layout`, stage names of layout 1) to
    `RUN_LAYOUT`: run.json's stage records and their recorded outputs, `notebooks/<stage>.ipynb` and `html/<stage>.html`
    take the stages' new names (`RENAMED_STAGES`). Returns the old names it renamed; changes `run` in place.

    Nothing is recomputed here and nothing is lost: every stage of a migrated folder runs again at the next
    `triage-cf reproduce` (its notebook is a new file), and the long ones resume from the durable work they left under
    `data/` (fine-tuning checkpoints, prediction chunks), whose paths do not carry stage names."""
    if run.get("layout", 1) >= RUN_LAYOUT:
        return []
    renamed = []
    stages = run.get("stages", {})
    for old, new in RENAMED_STAGES.items():
        if old not in stages:
            continue
        if new in stages:
            raise RuntimeError(f"{paths.run_json}: holds stage {old!r} and its new name {new!r}; move the run folder "
                               "aside and run again into a new one")
        stages[new] = stages.pop(old)
        for folder, ext in ((paths.notebooks, ".ipynb"), (paths.html, ".html")):
            if (folder / f"{old}{ext}").exists():
                os.replace(folder / f"{old}{ext}", folder / f"{new}{ext}")
        renamed.append(old)
    for rec in stages.values():      # recorded outputs that are a renamed stage's notebook or page
        rec["outputs"] = {_renamed_path(rel): h for rel, h in rec.get("outputs", {}).items()}
    run["layout"] = RUN_LAYOUT
    if renamed:
        run["migrated"] = {"from_layout": 1, "renamed": {o: RENAMED_STAGES[o] for o in renamed}}
    return renamed


def _renamed_path(rel: str) -> str:
    "A run folder's relative path with a layout-1 stage's notebook or page given the stage's new name."
    for folder, ext in (("notebooks/", ".ipynb"), ("html/", ".html")):
        stem = rel[len(folder):-len(ext)] if rel.startswith(folder) and rel.endswith(ext) else None
        if stem in RENAMED_STAGES:
            return f"{folder}{RENAMED_STAGES[stem]}{ext}"
    return rel


def render_html(nb_path: Path, html_path: Path) -> None:
    "Render an executed notebook to HTML with nbconvert (Quarto is not needed)."
    import nbformat
    from nbconvert import HTMLExporter
    nb = nbformat.read(nb_path, as_version=4)
    body, _ = HTMLExporter().from_notebook_node(nb)
    atomic_write_text(html_path, body)


def _error_message(stage: str, exc: Exception) -> str:
    ename = getattr(exc, "ename", type(exc).__name__)
    evalue = getattr(exc, "evalue", str(exc))
    cell = getattr(exc, "exec_count", None)
    where = f" in cell [{cell}]" if cell is not None else ""
    return f"stage {stage} failed{where}: {ename}: {evalue}"


def reproduce(dataset: str, profile: str = "smoke", out: str | Path | None = None, force: bool = False,
              until: str | None = None, quiet: bool = False, stages: list[str] | None = None,
              progress: bool | None = None, overrides: dict | None = None) -> list[StageResult]:
    """Run the chain for `dataset` under `profile` into the run folder.

    `until`: run only the stages before this one (used by a notebook run by hand to get its inputs).
    `overrides`: parameters set on top of `params/<dataset>.yaml` + profile (what a command's options such as
    `probe-margins --backend` set); they reach the stages' parameters, their keys and run.json like any other.
    Returns one StageResult per stage; raises StageFailed when a stage fails."""
    params = {**load_params(dataset, profile), **(overrides or {})}
    stages = list(stages or stages_for(params))
    if until is not None:
        if until in stages:
            stages = stages[: stages.index(until)]
        elif until in STAGES:  # an optional stage that is off: the stages declared before it
            stages = [s for s in stages if s in STAGES and STAGES.index(s) < STAGES.index(until)]
        else:
            raise _unknown_stages([until], "until")
    paths = RunPaths(run_dir_for(dataset, profile, out)).make()
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    results: list[StageResult] = []
    with FileLock(str(paths.root / ".lock")):
        run = load_run_json(paths)
        migrated = migrate_run_folder(paths, run)
        if migrated:
            say(f"{paths.root}: run folder of layout 1 migrated to layout {RUN_LAYOUT}: stages "
                + ", ".join(f"{o} -> {RENAMED_STAGES[o]}" for o in migrated) + " (they run again, resuming from their checkpoints)")
        policy = policy_for_dataset(dataset)
        run.update(dataset=dataset, profile=profile, access=policy.access, parameters=params, git=_git_commit(),
                   packages=_package_versions(),
                   platform={"machine": platform.machine(), "system": platform.system(), "python": sys.executable})
        run.setdefault("stages", {})
        write_json(paths.run_json, run)  # the run folder names its dataset (access policy) before any stage writes
        code_fp = _code_fingerprint()
        upstream_key = sha256_text(json.dumps({"dataset": dataset, "profile": profile, "code": code_fp}, sort_keys=True))
        ran_any = False
        # the stage kernels inherit these: in the chain, and python's str hashing (set and dict-of-set orders) is fixed
        chain_env = {CHAIN_ENV: "1", "PYTHONHASHSEED": str(params.get("seed", 0))}
        old_env = {k: os.environ.get(k) for k in chain_env}
        os.environ.update(chain_env)
        try:
            for stage in stages:
                nb = stage_notebook(stage)
                if not nb.exists():
                    raise FileNotFoundError(f"stage notebook {nb} is missing")
                declared = _notebook_parameters(nb)
                stage_params = {k: v for k, v in params.items() if k in declared}
                stage_params["run_dir"] = str(paths.root)
                key = sha256_text(json.dumps({"nb": _notebook_fingerprint(nb), "params": {k: v for k, v in stage_params.items() if k != "run_dir"},
                                              "upstream": upstream_key}, sort_keys=True, default=str))
                rec = run["stages"].get(stage, {})
                if (not force and not ran_any and rec.get("status") == "ok" and rec.get("key") == key
                        and _outputs_intact(paths, rec.get("outputs", {}))):
                    results.append(StageResult(stage, "skipped", 0.0))
                    say(f"{stage:<16} skipped   (unchanged)")
                    upstream_key = key
                    continue
                # a corrupted (or truncated) artifact of the stage's last run is detected by its sha256 and set aside
                quarantined = _quarantine_corrupt(paths, rec.get("outputs", {}))
                for rel in quarantined:
                    say(f"{stage:<16} {rel}: sha256 differs from run.json; moved to data/_quarantine/ and recomputed")
                t0, start_ns = time.perf_counter(), time.time_ns() - 1_000_000
                # an interrupted attempt of the same stage (killed or failed, same key, nothing upstream re-ran) left durable
                # work (checkpoints, prediction chunks) that this attempt resumes from: it counts among the stage's outputs
                resumed = (not ran_any and rec.get("status") in ("running", "failed") and rec.get("key") == key
                           and isinstance(rec.get("start_ns"), int))
                if resumed:
                    start_ns = min(start_ns, rec["start_ns"])
                ran_any = True
                out_nb = paths.notebooks / f"{stage}.ipynb"
                exec_nb = paths.data / "_executed" / f"{stage}.ipynb"  # unscanned: record-level area until published
                exec_nb.parent.mkdir(parents=True, exist_ok=True)
                exec_nb.unlink(missing_ok=True)
                run["stages"][stage] = {"status": "running", "key": key, "started": _dt.datetime.now().isoformat(timespec="seconds"),
                                        "start_ns": start_ns}
                if resumed:
                    run["stages"][stage]["resumed_from"] = rec.get("started")
                if quarantined:
                    run["stages"][stage]["quarantined"] = quarantined
                write_json(paths.run_json, run)
                try:
                    _execute(nb, exec_nb, stage_params, progress=(not quiet) if progress is None else progress)
                except Exception as exc:  # papermill's PapermillExecutionError or a kernel death
                    wall = time.perf_counter() - t0
                    msg = sanitize_message(_error_message(stage, exc), paths, policy)
                    where, blocked = exec_nb, None
                    if exec_nb.exists():  # the failed notebook is rendered for inspection, if it passes the scan
                        try:
                            _record_scan(run, stage, publish_notebook(paths, stage, exec_nb, policy), policy, say)
                            where = out_nb
                        except RenderBlocked as rb:
                            blocked = rb
                        except Exception:
                            pass
                    run["stages"][stage].update(status="failed", wall_s=round(wall, 3), error=msg,
                                                notebook=str(where.relative_to(paths.root)))
                    if blocked is not None:
                        run["stages"][stage]["render_blocked"] = [str(f) for f in blocked.findings[:200]]
                    write_json(paths.run_json, run)
                    results.append(StageResult(stage, "failed", wall))
                    say(f"{stage:<16} FAILED    {wall:7.1f} s")
                    extra = f"\n  {blocked}" if blocked is not None else ""
                    raise StageFailed(f"{msg}\n  executed notebook: {where}{extra}") from None
                try:
                    _record_scan(run, stage, publish_notebook(paths, stage, exec_nb, policy), policy, say)
                except RenderBlocked as rb:
                    wall = time.perf_counter() - t0
                    run["stages"][stage].update(status="failed", wall_s=round(wall, 3),
                                                error=f"stage {stage} failed: render blocked (record data in rendered outputs)",
                                                render_blocked=[str(f) for f in rb.findings[:200]],
                                                notebook=str(exec_nb.relative_to(paths.root)))
                    write_json(paths.run_json, run)
                    results.append(StageResult(stage, "failed", wall))
                    say(f"{stage:<16} BLOCKED   {wall:7.1f} s")
                    raise StageFailed(f"stage {stage} failed: {rb}") from None
                wall = time.perf_counter() - t0
                earlier = {rel for s in stages[:stages.index(stage)] for rel in run["stages"].get(s, {}).get("outputs", {})}
                outputs = _outputs_since(paths, start_ns, exclude=earlier)  # (a resumed attempt's window is wider)
                prov = paths.data / "provenance.json"
                if prov.exists():
                    run["data_files"] = json.loads(prov.read_text(encoding="utf-8")).get("files", {})
                models = _model_records(paths)
                if models:
                    run["models"] = models
                run["stages"][stage].update(status="ok", wall_s=round(wall, 3), outputs=outputs,
                                            finished=_dt.datetime.now().isoformat(timespec="seconds"))
                run.pop("error", None)
                write_json(paths.run_json, run)
                results.append(StageResult(stage, "ran", wall))
                say(f"{stage:<16} ran       {wall:7.1f} s")
                upstream_key = key
        finally:
            for k, v in old_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return results


def _model_records(paths: RunPaths) -> dict:
    """What run.json says of each trained model of the run folder (`data/models/<name>/emulator.json` or `model.json`):
    kind, base model and the sha256 of the base weights and of the trained weights (adapter or full model)."""
    out = {}
    for meta in sorted([*(paths.data / "models").glob("*/emulator.json"), *(paths.data / "models").glob("*/model.json")]):
        try:
            m = json.loads(meta.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        out[meta.parent.name] = {k: m[k] for k in ("kind", "ft_model", "model", "base_model", "base_sha256", "weights_sha256",
                                                  "n_parameters") if k in m}
    return out


def _record_scan(run: dict, stage: str, findings: list, policy, say) -> None:
    "Report-only mode (open and synthetic datasets): findings are recorded in run.json and counted on one line."
    rec = run["stages"][stage]
    rec["scan"] = {"mode": policy.mode, "findings": [str(f) for f in findings[:200]], "n_findings": len(findings)}
    if findings:
        say(f"{stage:<16} scan ({policy.mode}, {policy.access} dataset): {len(findings)} finding(s) of record data "
            "in rendered outputs; see run.json")


def kernel_manager_class():
    """The kernel manager of the stage kernels: on POSIX they talk over IPC sockets with a unique name in Jupyter's
    runtime folder, so that chains running side by side (a batch over datasets, a test beside its reference run)
    cannot race for the same free TCP port, a race that kills a kernel before it replies to `kernel_info`. TCP,
    Jupyter's default, where IPC is not available (Windows) or the runtime folder's path is too long for a socket."""
    from jupyter_client import AsyncKernelManager
    from jupyter_core.paths import jupyter_runtime_dir
    runtime = jupyter_runtime_dir()
    # a socket path holds at most 104 bytes (macOS; 108 on Linux): <runtime>/triage-cf-<12 hex>-ipc-<n>
    if os.name != "posix" or len(os.fsencode(runtime)) + 32 > 104:
        return AsyncKernelManager
    global _IPCKernelManager
    if _IPCKernelManager is None:
        import uuid
        from traitlets import CaselessStrEnum, default

        class IPCKernelManager(AsyncKernelManager):
            transport = CaselessStrEnum(["tcp", "ipc"], default_value="ipc", config=True)

            @default("ip")
            def _ip_default(self) -> str:   # Jupyter's default is "kernel-ipc" in the kernel's cwd, shared by all
                os.makedirs(runtime, exist_ok=True)
                return os.path.join(runtime, f"triage-cf-{uuid.uuid4().hex[:12]}")
        _IPCKernelManager = IPCKernelManager
    return _IPCKernelManager

_IPCKernelManager = None


def _execute(nb: Path, out_nb: Path, parameters: dict, progress: bool) -> None:
    import papermill as pm
    pm.execute_notebook(str(nb), str(out_nb), parameters=parameters, kernel_name="python3", cwd=str(nb.parent),
                        progress_bar=progress, log_output=False, request_save_on_cell_execute=False,
                        kernel_manager_class=kernel_manager_class())


def stage_setup(stage: str, dataset: str, profile: str, run_dir: str | Path | None = None, seed: int | None = None) -> RunPaths:
    "Resolve (and create) the run folder of `stage`; outside the chain, first run the stages before it."
    root = run_dir_for(dataset, profile, run_dir)
    if not os.environ.get(CHAIN_ENV):
        reproduce(dataset, profile, out=root, until=stage, quiet=True)
    if seed is not None:
        seed_everything(seed)
    paths = RunPaths(root).make()
    install_display_policy(policy_for_run(root))
    return paths
