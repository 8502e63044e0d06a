"""Fine-tuning under `accelerate launch --num_processes 2` on the CPU (gloo): the same steps as one process on the same
global batches, and a run killed mid-way resumes to the weights of an uninterrupted 2-process run. Tiny model, a few
steps: the distributed path is built on engines that also run on a CPU, so it is tested here (no GPU)."""
import json
import os
import signal
import subprocess
import time
from dataclasses import asdict

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")

from safetensors.torch import load_file  # noqa: E402

from triage_cf.audit.emulator import TrainSettings, train_emulator  # noqa: E402
from triage_cf.audit.ft_launch import launch, launch_command  # noqa: E402
from triage_cf.llm import load_causal_lm, tiny_causal_lm, tiny_tokenizer  # noqa: E402

LEVELS = [1, 2, 3]
WORDS = {1: "cardiac arrest", 2: "chest pain", 3: "ankle sprain"}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("dist")
    rng = np.random.default_rng(0)
    labels = [int(x) for x in rng.integers(1, 4, 48)]
    prompts = [f"<|im_start|>user\nPatient {i}: {WORDS[y]}.<|im_end|>\n<|im_start|>assistant\n" for i, y in enumerate(labels)]
    tok = tiny_tokenizer(prompts + ["1 2 3"], vocab_size=300)
    tiny_causal_lm("llama", tok, seed=0).save_pretrained(d / "base")
    tok.save_pretrained(d / "base")
    (d / "prompts.json").write_text(json.dumps(prompts))
    return d, prompts, labels


def _job(d, prompts, labels, out, epochs, prompts_file="prompts.json"):
    return dict(base=str(d / "base"), prompts=str(d / prompts_file), labels=labels, levels=LEVELS, out_dir=str(out),
                cpu=True, train=asdict(TrainSettings(epochs=epochs, batch_size=8, lr=5e-3, lora=False, seed=0,
                                                     patience=epochs)))


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_two_processes_take_the_single_process_steps(setup):
    d, prompts, labels = setup
    model, tok = load_causal_lm(d / "base")
    one = train_emulator(model, tok, prompts, labels, LEVELS, d / "one",
                         TrainSettings(epochs=2, batch_size=8, lr=5e-3, lora=False, seed=0, patience=2))
    two = launch(_job(d, prompts, labels, d / "two", 2), d / "job-two", num_processes=2, timeout=600)
    assert two["num_processes"] == 2
    assert len(two["step_losses"]) == len(one.step_losses) > 8
    np.testing.assert_allclose(two["step_losses"], one.step_losses, rtol=1e-4, atol=1e-5)
    got = load_file(two["weights"])
    want = {n: p for n, p in one.model.named_parameters() if p.requires_grad}
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_allclose(got[k].numpy(), want[k].detach().numpy(), atol=2e-4, err_msg=k)
    assert [h["epoch"] for h in two["history"]] == [1, 2]
    np.testing.assert_allclose([h["val_loss"] for h in two["history"]], [h["val_loss"] for h in one.history], rtol=1e-4)


def test_killed_two_process_run_resumes_to_the_same_weights(setup):
    d, prompts, labels = setup
    # 30 times the prompts: an epoch of about 90 steps per process, so that the kill (polled every 10 ms) lands after
    # the first epoch's checkpoint and long before the third ends, even on an idle machine (with 48 prompts an epoch
    # took under the old 0.2 s poll there, and the run finished before it was killed)
    prompts, labels = prompts * 30, labels * 30
    (d / "prompts_kill.json").write_text(json.dumps(prompts))
    job = lambda out: _job(d, prompts, labels, out, 3, prompts_file="prompts_kill.json")
    full = launch(job(d / "full"), d / "job-full", num_processes=2, timeout=600)
    (d / "job-kill").mkdir()
    (d / "job-kill" / "job.json").write_text(json.dumps(job(d / "kill")))
    proc = subprocess.Popen(launch_command(d / "job-kill" / "job.json", 2, cpu=True), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = d / "kill" / "checkpoints" / "LATEST.json"
    t0 = time.time()
    while not latest.exists() and proc.poll() is None and time.time() - t0 < 600:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)   # after the first epoch's checkpoint, in the middle of the second
    proc.wait()
    assert latest.exists() and json.loads(latest.read_text())["checkpoint"] in ("epoch-001", "epoch-002")
    resumed = launch(job(d / "kill"), d / "job-kill", num_processes=2, timeout=600)
    a, b = load_file(full["weights"]), load_file(resumed["weights"])
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert resumed["history"] == full["history"][:0] + resumed["history"] and len(resumed["history"]) == 3
    np.testing.assert_allclose([h["train_loss"] for h in resumed["history"]], [h["train_loss"] for h in full["history"]])


def test_qlora_is_refused_on_cpu(setup):
    d, _, _ = setup
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(ValueError, match="needs CUDA"):
        load_causal_lm(d / "base", load_in_4bit=True)
