"""What every recipe does around training: run it (Ctrl-C saves a checkpoint), then write the run's outputs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable

from .trainer import MixedAlgorithmTrainer, TrainingInterrupted


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
           resume_hint: str = "") -> None:
    """On the main process: ``summary.json``, the plot, the final model, the summary printed (without the long
    ``hidden`` entries). Then end training on every process (``accelerator.end_training``) and, if the run was
    interrupted, say where its checkpoint is and exit with status 130."""
    out = Path(trainer.args.output_dir)
    if trainer.accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        if plot is not None:
            plot(str(out / plot_name))
        trainer.save_model(str(out / "final_model"))
        print(json.dumps({k: v for k, v in summary.items() if k not in hidden}, indent=2))
        print(f"wrote {out / 'summary.json'}" + (f" and {out / plot_name}" if plot is not None else ""))
    # trackers closed and, under torchrun / accelerate launch, the process group torn down before the interpreter
    # exits (left to exit, gloo's threads can abort a finished rank)
    trainer.accelerator.end_training()
    if interrupted is not None:
        print(f"interrupted at step {interrupted.step}: checkpoint {interrupted.checkpoint}{resume_hint}")
        sys.exit(130)
