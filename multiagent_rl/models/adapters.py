"""Several policies on one base model: one named LoRA adapter per policy (and per frozen pool snapshot).

PEFT keeps every adapter in the same ``PeftModel``; one is active at a time. [`use_adapter`][multiagent_rl.models.adapters.use_adapter]
switches it for a forward pass or a ``generate`` call and puts the previous one back. PEFT's own ``set_adapter``
also makes only the active adapter trainable; here every trained adapter stays trainable (their gradients are
separate anyway: an adapter that did not take part in a forward pass gets no gradient from it) and snapshots stay
frozen, so one optimizer holds all the policies.

```pycon
>>> from multiagent_rl.models import load_model_and_tokenizer
>>> from multiagent_rl.models.adapters import add_adapters, use_adapter
>>> model, tok = load_model_and_tokenizer("tiny")
>>> model = add_adapters(model, {"proposer": {"r": 4, "target_modules": "all-linear"},
...                              "solver": {"r": 4, "target_modules": "all-linear"}})
>>> with use_adapter(model, "solver"):
...     model.active_adapter
'solver'
>>> model.active_adapter
'proposer'

```
"""

from __future__ import annotations

import contextlib
from typing import Any

TRAINED = "_multiagent_rl_trained_adapters"
"""The attribute of a ``PeftModel`` naming the adapters that train (the rest are frozen snapshots)."""


def add_adapters(model: Any, loras: dict[str, dict[str, Any]]):
    """``model`` wrapped in a ``PeftModel`` with one trainable LoRA adapter per entry of ``loras`` (name → ``LoraConfig``
    keyword arguments), the first one active; the base weights are frozen."""
    from peft import LoraConfig, get_peft_model

    if not loras:
        raise ValueError("add_adapters needs at least one adapter")
    for name in loras:
        if not name.isidentifier() or name in "lora_":
            raise ValueError(f"policy name {name!r}: use letters, digits and underscores, and not a part of 'lora_' "
                             "(it names an adapter module, which PEFT finds by its name after 'lora_')")
    (first, config), *rest = loras.items()
    peft_model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **config), adapter_name=first)
    for name, config in rest:
        peft_model.add_adapter(name, LoraConfig(task_type="CAUSAL_LM", **config))
    setattr(peft_model, TRAINED, list(loras))
    _fix_requires_grad(peft_model)
    return peft_model


def trained_adapters(model: Any) -> list[str]:
    """The adapters of ``model`` that train ([] for a model without them)."""
    return list(getattr(model, TRAINED, []))


def _fix_requires_grad(model: Any) -> None:
    trained = trained_adapters(model)
    frozen = [name for name in model.peft_config if name not in trained]
    if trained:
        model.set_requires_grad(trained, True)
    if frozen:
        model.set_requires_grad(frozen, False)


def activate(model: Any, name: str) -> None:
    """Make adapter ``name`` the active one, keeping every trained adapter trainable and every snapshot frozen."""
    if model.active_adapter != name:
        model.set_adapter(name)
        _fix_requires_grad(model)


@contextlib.contextmanager
def use_adapter(model: Any, name: str | None):
    """Run the block with adapter ``name`` active (None: leave the model as it is), then restore the previous one."""
    if name is None:
        yield
        return
    previous = model.active_adapter
    activate(model, name)
    try:
        yield
    finally:
        activate(model, previous)


def adapter_state(model: Any, name: str) -> dict:
    """Adapter ``name``'s weights (detached copies), keyed without the adapter name (PEFT's saved form)."""
    from peft import get_peft_model_state_dict

    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model, adapter_name=name).items()}


def add_snapshot(model: Any, source: str, name: str, state: dict | None = None) -> None:
    """A frozen adapter ``name`` with the configuration of ``source`` and its current weights (or ``state``)."""
    from peft import set_peft_model_state_dict

    model.add_adapter(name, model.peft_config[source])
    set_peft_model_state_dict(model, adapter_state(model, source) if state is None else state, adapter_name=name)
    _fix_requires_grad(model)


def remove_snapshot(model: Any, name: str) -> None:
    """Delete the frozen adapter ``name`` (a snapshot leaving its pool)."""
    if name in trained_adapters(model):
        raise ValueError(f"{name!r} is a trained policy, not a snapshot")
    active = model.active_adapter
    model.delete_adapter(name)
    if active != name:
        activate(model, active)
    _fix_requires_grad(model)
