"""What every recipe does around training: run it (Ctrl-C saves a checkpoint), then write the run's outputs and, on
request, push the model and its traces to the Hub."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

from .trainer import MixedAlgorithmTrainer, TrainingInterrupted


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The recipes' ``--help``: the description as written (its command examples keep their lines) and every
    option's default (an option shows it only with a help text of its own)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:  # "(default: None)" on an unset option says nothing
            return action.help
        return super()._get_help_string(action)


def add_hub_flags(parser: argparse.ArgumentParser) -> None:
    """``--push-to-hub REPO`` and ``--public``, the recipes' Hub flags (see [`publish`][multiagent_rl.training.run.publish])."""
    parser.add_argument("--push-to-hub", metavar="REPO",
                        help="at the end, push the model (with its card) to the Hub model repo REPO and the run's traces "
                             "to the dataset repo REPO-traces, which the model card names; needs HF_TOKEN (or "
                             "`huggingface-cli login`). Not done for an interrupted run")
    parser.add_argument("--public", action="store_true",
                        help="with --push-to-hub: create both repos public (by default they are private)")


def add_lora_flag(parser: argparse.ArgumentParser) -> None:
    """``--lora R``: train a LoRA adapter of rank R on every linear layer instead of the full model (see
    [`lora_config`][multiagent_rl.training.run.lora_config])."""
    parser.add_argument("--lora", type=int, metavar="R",
                        help="train a LoRA adapter of rank R (alpha 2R) on every linear layer instead of the whole "
                             "model, e.g. 16 for --model smollm2-135m")


def add_micro_batches_flag(parser: argparse.ArgumentParser) -> None:
    """``--micro-batches N`` (the trainer's ``gradient_accumulation_steps``) and ``--async-rollouts N`` (its
    ``async_rollouts``)."""
    parser.add_argument("--micro-batches", type=int, default=1, metavar="N",
                        help="split each step's batch into N micro-batches, each its own forward and backward pass "
                             "(gradient accumulation: the same update with 1/N of the activation memory), e.g. 4 for "
                             "a real model's long multi-turn traces")
    parser.add_argument("--async-rollouts", type=int, default=0, metavar="N",
                        help="play the next step's episodes while this step trains, at most N steps off-policy "
                             "(importance-corrected; docs/scaling.md); 0: on-policy")


def lora_config(rank: int | None) -> dict[str, Any] | None:
    """The ``[model] lora`` of ``--lora R`` (PEFT ``LoraConfig`` arguments), or None without it."""
    if rank is None:
        return None
    if rank < 1:
        raise SystemExit(f"--lora {rank}: the adapter's rank, at least 1")
    return {"r": rank, "lora_alpha": 2 * rank, "target_modules": "all-linear"}


def close_episode_log(trainer: MixedAlgorithmTrainer) -> None:
    """Merge the last steps' trace files into one shard on every process, then wait for all of them (the main
    process may read every process's traces next)."""
    sink = trainer.rollout.sink
    if sink is not None and hasattr(sink, "close"):
        sink.close()
    trainer.accelerator.wait_for_everyone()


def results_table(summary: dict[str, Any], hidden: tuple[str, ...] = ()) -> str:
    """The summary's short entries as a Markdown table, for the model card (long ones, curves and the command
    are left out)."""
    rows = []
    for key, value in summary.items():
        text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
        if key not in hidden and key != "command" and len(text) <= 200:
            rows.append(f"| {key} | {text.replace('|', '/')} |")
    return "\n".join(["| result | value |", "|---|---|", *rows]) if rows else ""


def publish(trainer: MixedAlgorithmTrainer, repo: str, *, public: bool = False) -> dict[str, str]:
    """Push the run to the Hub (main process): its traces to the dataset repo ``REPO-traces``, then the model to
    ``REPO`` with a card that names them (``final_model/README.md`` is rewritten to match); with several
    ``[policies]``, each policy to ``REPO-NAME``. All private unless ``public``. Returns the URLs."""
    from huggingface_hub import constants

    from ..data.hub import push_traces
    from ..data.traces import load_traces

    out = Path(trainer.args.output_dir)
    urls = {}
    folder = out / ("episodes" if trainer.args.episode_format == "jsonl" else "traces")
    if trainer.args.save_episodes and folder.is_dir():
        urls["traces"] = push_traces(load_traces(folder), f"{repo}-traces", private=not public,
                                     produced_by=trainer.command)
        trainer.model_card_datasets = [f"{repo}-traces"]
    if trainer.saves_per_policy:  # one repository per policy, REPO-NAME
        for name, repo_id in trainer.push_policies(repo, private=not public).items():
            urls[f"model {name}"] = f"{constants.ENDPOINT}/{repo_id}"
        return urls
    trainer.args.hub_model_id, trainer.args.hub_private_repo = repo, not public
    trainer.hub_model_id = None  # push_to_hub creates (or finds) the repo named now, whatever the trainer had
    if (out / "final_model").is_dir():
        trainer.write_model_card(str(out / "final_model"))
    trainer.push_to_hub()
    urls["model"] = f"{constants.ENDPOINT}/{trainer.hub_model_id}"
    return urls


def train(trainer: MixedAlgorithmTrainer, resume: bool = False) -> TrainingInterrupted | None:
    """``trainer.train()``; a Ctrl-C (after its checkpoint is saved) is returned instead of raised."""
    try:
        trainer.train(resume_from_checkpoint=True if resume else None)
    except TrainingInterrupted as exc:
        return exc
    return None


def finish(trainer: MixedAlgorithmTrainer, summary: dict[str, Any], plot: Callable[[str], None] | None,
           plot_name: str | None,
           interrupted: TrainingInterrupted | None, *, hidden: tuple[str, ...] = ("curves", "held_out"),
           resume_hint: str = "", push_to_hub: str | None = None, public: bool = False) -> None:
    """On the main process: ``summary.json``, the plot, the final model with its card (the summary's ``command``
    and short results), the summary printed (without the long ``hidden`` entries) and, with ``push_to_hub``, the
    model and its traces pushed ([`publish`][multiagent_rl.training.run.publish]). Then end training on every
    process (``accelerator.end_training``) and, if the run was interrupted, say where its checkpoint is and exit
    with status 130."""
    out = Path(trainer.args.output_dir)
    close_episode_log(trainer)
    if trainer.accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        if plot is not None:
            plot(str(out / plot_name))
        trainer.command = summary.get("command") or trainer.command
        trainer.model_card_results = trainer.model_card_results or results_table(summary, hidden) or None
        trainer.save_model(str(out / "final_model"))
        print(json.dumps({k: v for k, v in summary.items() if k not in hidden}, indent=2))
        print(f"wrote {out / 'summary.json'}" + (f" and {out / plot_name}" if plot is not None else ""))
        if push_to_hub and interrupted is not None:
            print(f"not pushed to {push_to_hub}: the run was interrupted; resume it to the end, then push")
        elif push_to_hub:
            print("pushed: " + ", ".join(publish(trainer, push_to_hub, public=public).values()))
    # trackers closed and, under torchrun / accelerate launch, the process group torn down before the interpreter
    # exits (left to exit, gloo's threads can abort a finished rank)
    trainer.accelerator.end_training()
    if interrupted is not None:
        print(f"interrupted at step {interrupted.step}: checkpoint {interrupted.checkpoint}{resume_hint}")
        sys.exit(130)
