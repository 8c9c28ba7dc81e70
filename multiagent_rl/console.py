"""One readable console line per logging step; the full metrics go to the loggers (``report_to``).

    step 20/500  episodes 5,120  reward kuhn_selfplay player_0 -0.06 player_1 +0.06  loss rl -0.0031  eval exploitability 0.231 avg_exploitability 0.250

Transformers prints every log dict (30+ keys here) between progress-bar updates; these callbacks
replace its ``ProgressCallback``/``PrinterCallback`` printing and keep its progress bar.
"""

from __future__ import annotations

from collections import defaultdict

from transformers import TrainerCallback
from transformers.trainer_callback import ProgressCallback


def console_line(logs: dict, step: int, max_steps: int) -> str:
    """The one line printed for a log dict."""
    parts = [f"step {step}/{max_steps}"]
    if "episodes" in logs:
        parts.append(f"episodes {int(logs['episodes']):,}")
    rewards: dict[str, list[str]] = defaultdict(list)
    for key, value in logs.items():
        bits = key.split("/")
        if len(bits) == 4 and bits[3] == "reward_mean" and isinstance(value, (int, float)):
            env, role, _ = bits[:3]
            rewards[env].append(f"{role} {value:+.3g}")
    for env, items in rewards.items():
        parts.append(f"reward {env} " + " ".join(items))
    failed = sum(v for k, v in logs.items() if k.endswith("/failed_episodes") and isinstance(v, (int, float)))
    if failed:
        parts.append(f"failed {failed:g}")
    losses = [f"{s} {logs[f'loss/{s}']:.4g}" for s in ("rl", "ce", "ref_kl")
              if isinstance(logs.get(f"loss/{s}"), (int, float)) and (s == "rl" or logs[f"loss/{s}"])]
    if losses:
        parts.append("loss " + " ".join(losses))
    if logs.get("health/skipped_steps"):
        parts.append(f"skipped steps {logs['health/skipped_steps']:g}")
    evals = [f"{k.split('/')[-1]} {v:.3g}" for k, v in logs.items()
             if k.startswith("eval/") and isinstance(v, (int, float))]
    if evals:
        parts.append("eval " + " ".join(evals))
    return "  ".join(parts)


def _is_training_log(logs: dict) -> bool:
    return "loss" in logs or any(k.startswith("eval/") for k in logs)


class ConsoleProgressCallback(ProgressCallback):
    """Transformers' progress bar, printing :func:`console_line` instead of the whole log dict."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None and logs and _is_training_log(logs):
            self.training_bar.write(console_line(logs, state.global_step, state.max_steps))


class ConsolePrinterCallback(TrainerCallback):
    """Without a progress bar (``disable_tqdm``): print :func:`console_line`."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs and _is_training_log(logs):
            print(console_line(logs, state.global_step, state.max_steps), flush=True)
