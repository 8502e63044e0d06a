"""The emulator's fine-tuning in several processes with Hugging Face `accelerate` (hand-written glue, not a stage).

`05_emulator` fine-tunes in its own kernel by default. When the profile sets `ft_num_processes` > 1 it writes a job
file and runs

    accelerate launch --multi_gpu --num_processes N --num_machines 1 --mixed_precision no --dynamo_backend no \\
        -m triage_cf.audit.ft_launch JOB.json

(`--multi_gpu` is accelerate's torchrun launcher; on a machine without GPUs the job's `cpu` flag makes every process
an `Accelerator(cpu=True)`, which joins a gloo process group: several CPU processes on one machine. accelerate's own
`--cpu` flag starts a single process unless an MPI host file is given.)

so that the papermill chain stays the entry point. Every process loads the base model folder, `train_emulator` runs
with the job's `train` settings (the fields of `TrainSettings`) under the `Accelerator` (DDP: each process takes its
rows of every global batch, gradients are averaged), the main process alone writes the checkpoints (which resume
under any process count) and, at the end, the trained weights and the history into the job's folder, where the stage
reads them.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from ..core import write_json
from .emulator import TrainSettings, trainable_state, train_emulator
from ..llm import load_causal_lm

RESULT_WEIGHTS, RESULT_JSON = "trained.safetensors", "result.json"


def launch_command(job_path: str | Path, num_processes: int, cpu: bool, port: int | None = None) -> list[str]:
    "The `accelerate launch` command line that runs `job_path` in `num_processes` processes."
    if port is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    exe = Path(sys.executable).with_name("accelerate")
    cmd = [str(exe), "launch", "--num_processes", str(num_processes), "--num_machines", "1", "--mixed_precision", "no",
           "--dynamo_backend", "no", "--main_process_port", str(port)]
    if num_processes > 1:
        cmd.append("--multi_gpu")
    elif cpu:
        cmd.append("--cpu")
    return cmd + ["-m", "triage_cf.audit.ft_launch", str(job_path)]


def launch(job: dict, work: str | Path, num_processes: int, cpu: bool | None = None,
           timeout: float | None = None) -> dict:
    """Write `job` to `work/job.json`, run it under `accelerate launch`, and return the main process's result record
    (history, best_epoch, stopped_early, n_truncated, step_losses) and the path of the trained weights."""
    import torch
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    cpu = (not torch.cuda.is_available()) if cpu is None else cpu
    write_json(work / "job.json", {**job, "cpu": cpu})
    (work / RESULT_JSON).unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    p = subprocess.run(launch_command(work / "job.json", num_processes, cpu), capture_output=True, text=True, env=env,
                       timeout=timeout)
    if p.returncode != 0 or not (work / RESULT_JSON).exists():
        raise RuntimeError(f"accelerate launch ({num_processes} processes) failed with exit code {p.returncode}:\n"
                           f"{p.stderr[-4000:]}")
    return {**json.loads((work / RESULT_JSON).read_text()), "weights": str(work / RESULT_WEIGHTS)}


def run(job_path: str | Path) -> None:
    "The body of every launched process (see the module docstring)."
    from accelerate import Accelerator
    from safetensors.torch import save_file
    job = json.loads(Path(job_path).read_text())
    work = Path(job_path).parent
    acc = Accelerator(cpu=bool(job.get("cpu")))
    model, tok = load_causal_lm(job["base"], dtype=job.get("dtype"),
                                device=None if acc.device.type == "cpu" else str(acc.device))
    prompts = json.loads(Path(job["prompts"]).read_text())
    res = train_emulator(model, tok, prompts, job["labels"], job["levels"], job["out_dir"],
                         TrainSettings(**job["train"]), accelerator=acc)
    if acc.is_main_process:
        save_file(trainable_state(res.model), str(work / RESULT_WEIGHTS))
        write_json(work / RESULT_JSON, dict(history=res.history, best_epoch=res.best_epoch,
                                            stopped_early=res.stopped_early, n_truncated=res.n_truncated,
                                            step_losses=res.step_losses, num_processes=acc.num_processes))
    acc.wait_for_everyone()


if __name__ == "__main__":
    run(sys.argv[1])
