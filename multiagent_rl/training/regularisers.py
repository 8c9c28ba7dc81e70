"""Regularisers: loss terms added to the streams' loss, each with its own small typed config, registered by ``type``
like algorithms. The trainer composes the ones the experiment lists (``[[regulariser]]``) and knows none by name.

- ``entropy``: an entropy bonus on the rl tokens, −c · Σ H(π_θ) / N_rl, with an optional linear anneal of c.
- ``magnet``: an R-NaD-style pull β · Σ KL(π_θ ‖ ρ) / N_rl toward a magnet ρ that is the uniform distribution over each
  token's choices for the first period, then a frozen copy of the policy renewed every period (saved in checkpoints).

```toml
[[regulariser]]
type = "magnet"
coef = 0.3
start = 100
every = 200
```

A regulariser of your own: subclass [`Regulariser`][multiagent_rl.training.regularisers.Regulariser] with a config
class whose ``type`` has a default, decorate it with [`register_regulariser`][multiagent_rl.training.regularisers.register_regulariser],
and list it (or its import path ``"package.module:MyRegulariser"``) as ``type``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, ClassVar

import pydantic
import torch
from pydantic import ConfigDict

from ..backends.scoring import frozen_copy
from ..registry import Registry
from .loss import kl_to_magnet


class RegulariserConfig(pydantic.BaseModel):
    """Base of every regulariser's config: ``type`` names the registered class."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)
    type: str


class Regulariser:
    """A loss term. ``term`` gets the scored micro-batch and returns the term (a scalar tensor, already normalised)
    and its metrics as (sum, count) pairs; the trainer adds the term to the loss in the experiment's order."""

    config_class: ClassVar[type[RegulariserConfig]] = RegulariserConfig
    needs_logits: ClassVar[bool] = False
    """Whether the term reads the logits at the read positions (which forces the loss's own scoring path)."""

    def __init__(self, config: RegulariserConfig, max_steps: int):
        self.config, self.max_steps = config, max_steps

    def coef_at(self, step: int) -> float:
        """The term's weight at ``step`` (0: the term is skipped, and its inputs not computed)."""
        raise NotImplementedError

    def before_step(self, step: int, policy: torch.nn.Module) -> None:
        """Called once before each step's rollout (e.g. to renew a magnet). Default: nothing."""

    def term(self, step: int, scored: Any, batch: dict, normalizer: Callable[[torch.Tensor], torch.Tensor],
             read_logits_of: Callable[[torch.nn.Module], torch.Tensor]) -> tuple[torch.Tensor, dict]:
        """The term at ``step`` for one micro-batch. ``scored`` has ``logps``, ``entropies`` (B, T) and, when
        ``needs_logits``, ``read`` (B, T) and ``read_logits`` (M, V), ``temperatures`` and ``allowed`` at the read
        positions; ``read_logits_of(model)`` gives another model's logits there."""
        raise NotImplementedError

    def logs(self, step: int) -> dict[str, float]:
        """Values logged with every log line (e.g. a scheduled coefficient). Default: none."""
        return {}

    def save(self, folder: str) -> None:
        """Write what a resumed run needs into a checkpoint folder (main process). Default: nothing."""

    def load(self, folder: str, step: int, policy: torch.nn.Module, device: Any) -> None:
        """Restore from a checkpoint folder at ``step``. Default: nothing."""


REGULARISERS: Registry[type[Regulariser]] = Registry("regulariser", base=Regulariser)
"""Registered regulariser classes by config ``type``."""


def register_regulariser(cls: type[Regulariser]) -> type[Regulariser]:
    """Class decorator: register ``cls`` under the default ``type`` of its ``config_class``."""
    return REGULARISERS.register(cls.config_class.model_fields["type"].default, cls)


def parse_regulariser_config(d: dict[str, Any] | RegulariserConfig) -> RegulariserConfig:
    """A regulariser's typed config from ``{"type": ..., ...}`` (unknown types and keys fail, naming them)."""
    if isinstance(d, RegulariserConfig):
        return d
    if not isinstance(d, dict) or "type" not in d:
        raise ValueError(f"a [[regulariser]] needs a 'type' ({', '.join(sorted(REGULARISERS))}); got {d!r}")
    cls = REGULARISERS.lookup(d["type"])
    return cls.config_class.model_validate({**d, "type": cls.config_class.model_fields["type"].default})


def build_regulariser(config: RegulariserConfig, max_steps: int) -> Regulariser:
    return REGULARISERS.lookup(config.type)(config, max_steps)


# -- entropy ----------------------------------------------------------------------------------------------------


class EntropyConfig(RegulariserConfig):
    type: str = "entropy"
    coef: float = pydantic.Field(ge=0)
    """Weight c of the entropy bonus on the rl tokens (normalised like the rl stream)."""
    final: float | None = pydantic.Field(None, ge=0)
    """Anneal c linearly to this value between ``anneal_start`` and ``anneal_end`` (None: a constant bonus)."""
    anneal_start: int = pydantic.Field(0, ge=0)
    anneal_end: int | None = pydantic.Field(None, ge=1)
    """Step where c reaches ``final`` (None: the last step)."""


@register_regulariser
class EntropyBonus(Regulariser):
    """−c · Σ H(π_θ) over the rl tokens / N_rl (with the legal-action harness, H is the entropy over the legal
    words)."""

    config_class = EntropyConfig

    def __init__(self, config: EntropyConfig, max_steps: int):
        super().__init__(config, max_steps)
        end = config.anneal_end if config.anneal_end is not None else max_steps
        if config.final is not None and end <= config.anneal_start:
            raise ValueError(f"[[regulariser]] entropy: anneal_start={config.anneal_start}, anneal_end={end} (None "
                             "means the last step): the end must come after the start")
        self.end = end

    def coef_at(self, step: int) -> float:
        c = self.config
        if c.final is None:
            return c.coef
        frac = min(1.0, max(0.0, (step - c.anneal_start) / (self.end - c.anneal_start)))
        return c.coef + frac * (c.final - c.coef)

    def term(self, step, scored, batch, normalizer, read_logits_of):
        total = (scored.entropies * batch["rl_mask"]).sum()
        return -(self.coef_at(step) * total / normalizer(batch["num_rl_tokens"])), {}

    def logs(self, step: int) -> dict[str, float]:
        return {"entropy_coef": self.coef_at(step)} if self.config.final is not None else {}


# -- magnet -----------------------------------------------------------------------------------------------------

MAGNET_FILE = "magnet.pt"
"""The magnet's weights in a checkpoint folder (when it is a policy copy)."""


class MagnetConfig(RegulariserConfig):
    type: str = "magnet"
    coef: float = pydantic.Field(gt=0)
    """Weight β of the KL pull toward the magnet, β · Σ KL(π_θ ‖ ρ) over the rl tokens / N_rl."""
    start: int = pydantic.Field(0, ge=0)
    """Step where the term starts."""
    every: int | None = pydantic.Field(None, ge=1)
    """From ``start + every`` on, every this many steps the magnet becomes a frozen copy of the current policy; before
    that it is the uniform distribution over each token's choices (the term is then an entropy bonus). None: the
    magnet stays uniform."""


@register_regulariser
class Magnet(Regulariser):
    """R-NaD's moving magnet (the KL is exact over the distribution each token was sampled from: temperature and
    legal words)."""

    config_class = MagnetConfig
    needs_logits = True

    def __init__(self, config: MagnetConfig, max_steps: int):
        super().__init__(config, max_steps)
        self.model: torch.nn.Module | None = None
        """The frozen policy copy the term pulls toward; None while the magnet is uniform."""
        self._renewed_at: int | None = None

    def coef_at(self, step: int) -> float:
        return self.config.coef if step >= self.config.start else 0.0

    def is_uniform_at(self, step: int) -> bool:
        c = self.config
        return c.every is None or step < c.start + c.every

    def renews_at(self, step: int) -> bool:
        return not self.is_uniform_at(step) and (step - self.config.start) % self.config.every == 0

    def before_step(self, step: int, policy: torch.nn.Module) -> None:
        # every process copies its own replica, which DDP keeps identical
        if self.renews_at(step) and self._renewed_at != step:
            if self.model is None:
                self.model = frozen_copy(policy)
            else:
                self.model.load_state_dict(policy.state_dict())
            self._renewed_at = step

    def term(self, step, scored, batch, normalizer, read_logits_of):
        magnet_logits = None
        if self.model is not None:
            with torch.no_grad():
                magnet_logits = read_logits_of(self.model)
        per_row = kl_to_magnet(scored.read_logits, magnet_logits, scored.temperatures, scored.allowed)
        kl = torch.zeros_like(scored.logps).masked_scatter(scored.read, per_row)
        term = self.coef_at(step) * (kl * batch["rl_mask"]).sum() / normalizer(batch["num_rl_tokens"])
        return term, {"magnet/kl": ((kl.detach() * batch["rl_mask"]).sum(), batch["num_rl_tokens"])}

    def save(self, folder: str) -> None:
        if self.model is not None:
            torch.save(self.model.state_dict(), os.path.join(folder, MAGNET_FILE))

    def load(self, folder: str, step: int, policy: torch.nn.Module, device: Any) -> None:
        path = os.path.join(folder, MAGNET_FILE)
        # The magnet saved with the checkpoint is the one the last completed step (step - 1) pulled toward.
        if not self.is_uniform_at(step - 1):
            if not os.path.isfile(path):
                raise FileNotFoundError(f"{folder} has no {MAGNET_FILE}, but the magnet at step {step} is a copy of an "
                                        "earlier policy (every): resume from a checkpoint written with the magnet "
                                        "settings of this run")
            self.model = frozen_copy(policy)
            self.model.load_state_dict(torch.load(path, map_location=device, weights_only=True))
