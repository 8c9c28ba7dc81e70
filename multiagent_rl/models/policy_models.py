"""Several policies as full models: one module that holds them, so one trainer, optimizer and checkpoint serve all.

[`PolicyModels`][multiagent_rl.models.policy_models.PolicyModels] is what the trainer trains when every
``[policies.NAME]`` names its own ``model``: its parameters are ``policies.NAME.<the model's own names>``, so the
optimizer can give each policy its own learning rate and each policy saves to its own folder. It has no forward pass
of its own: the trainer scores each policy's rows with that policy's model and each policy's backend samples from
its own model, so no call depends on which policy was used last (the LoRA route switches PEFT's active adapter).

```pycon
>>> from multiagent_rl.models import load_model_and_tokenizer
>>> from multiagent_rl.models.policy_models import PolicyModels
>>> (a, tok), (b, _) = load_model_and_tokenizer("tiny"), load_model_and_tokenizer("tiny")
>>> models = PolicyModels({"proposer": a, "solver": b})
>>> models["solver"] is b, sorted({n.split(".")[1] for n, _ in models.named_parameters()})
(True, ['proposer', 'solver'])

```
"""

from __future__ import annotations

from typing import Any

import torch


class PolicyModels(torch.nn.Module):
    """Full models by policy name (the first is the one the Trainer reads its ``config`` from)."""

    def __init__(self, models: dict[str, Any]):
        super().__init__()
        if len(models) < 2:
            raise ValueError("PolicyModels holds two or more policies; one policy is the model itself")
        for name in models:
            if not name.isidentifier():
                raise ValueError(f"policy name {name!r}: use letters, digits and underscores (it names a module)")
        self.policies = torch.nn.ModuleDict(models)

    def __getitem__(self, name: str):
        return self.policies[name]

    @property
    def config(self):
        """The first policy's ``config`` (what the Trainer and TRL read: pad token, model id, attention kind)."""
        return next(iter(self.policies.values())).config

    @property
    def generation_config(self):
        return next(iter(self.policies.values())).generation_config

    def forward(self, *args, **kwargs):
        raise TypeError(f"PolicyModels holds the models of policies {list(self.policies)} and runs none of them "
                        "itself: call one, models[NAME](...)")

    def get_output_embeddings(self):
        return next(iter(self.policies.values())).get_output_embeddings()

    def add_model_tags(self, tags) -> None:
        for model in self.policies.values():
            model.add_model_tags(tags)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None) -> None:
        for model in self.policies.values():
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gradient_checkpointing_kwargs)

    def enable_input_require_grads(self) -> None:
        for model in self.policies.values():
            model.enable_input_require_grads()


def policy_of_parameter(name: str, policies: list[str]) -> str | None:
    """The policy a ``PolicyModels`` parameter belongs to (``policies.<policy>.…``), if it is one of ``policies``."""
    parts = name.split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "policies" and parts[1] in policies else None


def policy_part(experiment, module, name: str) -> tuple[Any, str | None]:
    """What runs learner ``name`` inside the module that holds the run's learners: ``(model, adapter)`` — its own
    model (full-model policies), the shared base with its adapter active, or the one model."""
    if experiment.uses_full_models:
        return module[name], None
    return module, name if experiment.uses_adapters else None


def load_policies(experiment, device=None, adapters: bool = True) -> tuple[Any, Any]:
    """The run's learners as they start, in the module that holds them (``[model] name``; with ``[policies]`` one
    adapter each — unless ``adapters`` is False, for a caller that adds them itself — or each policy's own
    ``model``), and the tokenizer; [`policy_part`][multiagent_rl.models.policy_models.policy_part] finds each learner
    in it."""
    from . import load_model_and_tokenizer
    from .adapters import add_adapters
    from ..policies import policy_lora

    if experiment.uses_full_models:
        return load_policy_models(experiment, device=device)
    model, tokenizer = load_model_and_tokenizer(experiment.model.name, device=device)
    if adapters and experiment.uses_adapters:
        model = add_adapters(model, {name: policy_lora(experiment, name) for name in experiment.policy_names()})
    return model, tokenizer


def load_policy_models(experiment, device=None) -> tuple[PolicyModels, Any]:
    """Every learner's own model (``[policies.NAME] model``) in one [`PolicyModels`][multiagent_rl.models.policy_models.PolicyModels],
    and the tokenizer they share (refused, naming both, when two policies' tokenizers differ)."""
    from . import load_model_and_tokenizer

    models, tokenizer, first = {}, None, None
    for name in experiment.policy_names():
        source = experiment.policy_base(name)
        models[name], tok = load_model_and_tokenizer(source, device=device)
        if tokenizer is None:
            tokenizer, first = tok, (name, source)
        else:
            check_same_tokenizer(tokenizer, tok, first, (name, source))
    return PolicyModels(models), tokenizer


def check_same_tokenizer(tokenizer, other, first: tuple[str, str], second: tuple[str, str]) -> None:
    """Refuse two policies whose tokenizers differ: every trace is token ids that any policy's scorer, the collator's
    padding and the evaluations read with one tokenizer."""
    same = (tokenizer.get_vocab() == other.get_vocab()
            and tokenizer.all_special_tokens == other.all_special_tokens
            and getattr(tokenizer, "chat_template", None) == getattr(other, "chat_template", None))
    if not same:
        raise ValueError(f"[policies.{second[0]}] model = {second[1]!r} has another tokenizer than [policies."
                         f"{first[0]}] model = {first[1]!r}: full-model policies share one tokenizer (the same "
                         "model family, e.g. SmolLM2-135M and SmolLM2-360M); use models with the same tokenizer")


__all__ = ["PolicyModels", "check_same_tokenizer", "load_policies", "load_policy_models", "policy_of_parameter",
           "policy_part"]
