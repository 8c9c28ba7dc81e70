"""Interrupted runs: SIGKILL mid-run then --resume equals an uninterrupted run; Ctrl-C saves and exits 130.

The Kuhn recipe runs in subprocesses (a real kill, a real signal). "Equal" means the same deals at
every step, every episode id logged exactly once, the same RAE baselines, the same evaluation curve
and the same final weights (CPU float tolerance).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "kuhn_poker.py"
FLAGS = ["--steps", "10", "--warmup-steps", "2", "--groups-per-step", "16", "--group-size", "4",
         "--eval-every", "2", "--save-every", "2", "--episode-format", "jsonl", "--magnet-every", "2",
         "--algo", "rae"]  # rae: its running baselines are state a resume must restore
ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
       "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false"}


def command(out: Path, *extra: str) -> list[str]:
    return [sys.executable, str(RECIPE), *FLAGS, "--output-dir", str(out), *extra]


def run(out: Path, *extra: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(command(out, *extra), env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def start_and_wait_for(out: Path, checkpoint: int, logged_step: int = -1) -> subprocess.Popen:
    """Start the recipe; return once ``checkpoint-N`` is completely written and the episode log has reached
    ``logged_step`` (the run goes on)."""
    proc = subprocess.Popen(command(out), env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    marker = out / f"checkpoint-{checkpoint}" / "callbacks_state.json"  # the last file a checkpoint gets
    log = out / "episodes" / "rank0.jsonl"
    deadline = time.time() + 300
    def reached() -> bool:
        if not marker.exists():
            return False
        return logged_step < 0 or f'{{"step": {logged_step},' in (log.read_text() if log.exists() else "")

    while not reached():
        assert proc.poll() is None, f"the run ended too early: {proc.communicate()[0][-3000:]}"
        assert time.time() < deadline, "no checkpoint within 300 s"
        time.sleep(0.01)
    return proc


def episode_log(out: Path) -> list[dict]:
    lines = (out / "episodes" / "rank0.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]  # every line parses


def deals(log: list[dict]) -> dict[str, tuple[int, str]]:
    return {ep["id"]: (ep["step"], json.loads(ep["task"]["info"])["cards"]) for ep in log}


def assert_same_run(a: Path, b: Path) -> None:
    log_a, log_b = episode_log(a), episode_log(b)
    ids_b = [ep["id"] for ep in log_b]
    assert len(ids_b) == len(set(ids_b)), "an episode was logged twice"
    assert deals(log_a) == deals(log_b)  # the same tasks and deals at every step
    state_a = json.loads((a / "checkpoint-10" / "algorithms_state.json").read_text())
    state_b = json.loads((b / "checkpoint-10" / "algorithms_state.json").read_text())
    (baselines_a,) = [s["baselines"] for s in state_a.values() if "baselines" in s]
    (baselines_b,) = [s["baselines"] for s in state_b.values() if "baselines" in s]
    assert baselines_a.keys() == baselines_b.keys() and baselines_a
    for key, value in baselines_a.items():
        assert baselines_b[key] == pytest.approx(value, abs=1e-9), key
    weights_a = load_file(str(a / "final_model" / "model.safetensors"))
    weights_b = load_file(str(b / "final_model" / "model.safetensors"))
    assert weights_a.keys() == weights_b.keys()
    for name, tensor in weights_a.items():
        torch.testing.assert_close(weights_b[name], tensor, atol=1e-6, rtol=1e-5, msg=name)
    curve_a = json.loads((a / "summary.json").read_text())["curve"]
    curve_b = json.loads((b / "summary.json").read_text())["curve"]
    assert [p["step"] for p in curve_a] == [p["step"] for p in curve_b]
    for p, q in zip(curve_a, curve_b):
        assert q["exploitability"] == pytest.approx(p["exploitability"], abs=1e-6)
        assert q["avg_exploitability"] == pytest.approx(p["avg_exploitability"], abs=1e-6)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted")
    run(out)
    return out


def test_sigkill_then_resume_equals_an_uninterrupted_run(tmp_path, uninterrupted):
    out = tmp_path / "killed"
    proc = start_and_wait_for(out, checkpoint=4, logged_step=5)  # steps 4 and 5 are logged but not checkpointed
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    lines = (out / "episodes" / "rank0.jsonl").read_text().splitlines()
    killed_at = max(json.loads(line)["step"] for line in lines if line.endswith("}"))
    assert 5 <= killed_at < 9, killed_at  # it died mid-run, past the checkpoint
    run(out, "--resume")
    assert_same_run(uninterrupted, out)


def test_ctrl_c_saves_a_checkpoint_the_summary_and_the_model_and_exits_130(tmp_path, uninterrupted):
    out = tmp_path / "interrupted"
    proc = start_and_wait_for(out, checkpoint=2)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, output[-3000:]
    (line,) = [x for x in output.splitlines() if x.startswith("interrupted at step ")]
    step = int(line.split()[3].rstrip(":"))
    assert 2 <= step < 10
    assert f"checkpoint {out / f'checkpoint-{step}'}" in line and "--resume" in line
    assert (out / f"checkpoint-{step}" / "rollout_state_rank0.json").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["steps"] == step
    assert (out / "final_model" / "model.safetensors").exists()
    assert "Traceback" not in output
    run(out, "--resume")
    assert_same_run(uninterrupted, out)
