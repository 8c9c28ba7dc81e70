"""Training: scored traces → [`collate`][multiagent_rl.training.collate] (tensors) →
[`loss`][multiagent_rl.training.loss] (the stream table) → [`MixedAlgorithmTrainer`][multiagent_rl.training.trainer.MixedAlgorithmTrainer]
(TRL's ``GRPOTrainer`` as a thin adapter), with its arguments, callbacks and checkpoints.

``MixedAlgorithmTrainer``, ``MixedAlgorithmConfig`` and ``TrainingInterrupted`` are importable from here; TRL is
imported only when one of them is first used, so the loss and the collator stay light.
"""

_LAZY = {"MixedAlgorithmTrainer": "trainer", "TrainingInterrupted": "trainer", "MixedAlgorithmConfig": "arguments"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_LAZY)
