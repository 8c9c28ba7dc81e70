"""Experiment configuration: one schema for Python objects (notebooks) and TOML (recipes).

.. code-block:: toml

    [algo]                      # the default algorithm
    type = "rae"

    [model]
    name = "tiny"

    [[env]]
    id = "kuhn_poker"
    group_size = 8

    [env.roles.player_1]        # per-role binding and overrides
    model = "scripted"
    policy = "multiagent_rl.envs.kuhn_poker:random_policy"
    trainable = false

    [trainer]                   # fields of MixedAlgorithmConfig (a TRL GRPOConfig)
    max_steps = 100

Unknown keys and impossible combinations fail at load time with a message naming the key and
the fix.
"""

from __future__ import annotations

import functools
import logging
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Callable, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from .agents.harness import HarnessConfig
from .algorithms import ALGORITHMS, AlgorithmConfig, parse_algorithm_config
from .backends.base import SamplingParams, check_trained_temperature
from .backends.endpoint import EndpointConfig, is_endpoint_reference, parse_reference
from .backends.vllm_config import VLLMConfig
from .envs.registry import ENVS
from .policies import (DEFAULT_POLICY, POOL_PREFIX, PolicyConfig, PoolSamplingConfig, check_policies,  # noqa: F401
                       check_seat_binding, is_pool_reference, policy_of_seat)
from .registry import import_object
from .tasks.datasets import DatasetTasksConfig
from .training.phases import PhaseConfig, apply_phases, phase_boundaries
from .training.regularisers import RegulariserConfig, parse_regulariser_config

# A dict such as {"type": "grpo"} becomes the registered algorithm's typed config.
OptionalAlgorithm = Annotated[
    AlgorithmConfig | None, BeforeValidator(lambda v: None if v is None else parse_algorithm_config(v))
]
RegulariserField = Annotated[RegulariserConfig, BeforeValidator(parse_regulariser_config)]


logger = logging.getLogger(__name__)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, use_attribute_docstrings=True)


class RoleConfig(_Strict):
    """How one seat of an environment is played and trained."""

    model: str = "policy"
    """``"policy"`` (a model being trained: the one policy, or the ``[policies]`` entry named by ``policy``), a frozen
    model (``"tiny"``, a hub id or a local path), ``"pool:NAME"`` (a past snapshot of policy NAME, drawn per task
    group from its opponent pool by ``pool``; never trained) or ``"scripted"``."""
    trainable: bool | None = None
    """Whether this seat's traces are trained on. Default: True for ``policy`` seats; for a frozen or scripted
    seat, True when its algorithm (its own ``algo``, else the env's, else the experiment's) imitates another
    agent (``sft``), False otherwise (an opponent, a judge, a simulated user)."""
    algo: OptionalAlgorithm = None
    """This role's algorithm; default: the environment's, then the experiment's."""
    policy: Callable[..., Any] | str | None = None
    """Policy seats: which ``[policies]`` entry plays and learns from this seat (default: the only one). Scripted
    seats: a function ``turn -> str``, or an import path of a factory called with ``policy_args``."""
    policy_args: dict[str, Any] = Field(default_factory=dict)
    """Arguments of the scripted policy factory."""
    sampling: dict[str, Any] = Field(default_factory=dict)
    """Sampling overrides for this seat (``temperature``, ``max_new_tokens``, ...; see ``SamplingParams``)."""
    timeout: float | None = Field(None, gt=0)
    """Seconds one reply of this seat may take (a per-reply timeout); None: only the episode's timeout applies."""
    harness: HarnessConfig | None = None
    """How the seat converses: ``{id = "chat"}`` or ``{id = "tools"}`` (tool calls, with its limits); default: the
    environment's choice for this role (``Env.default_harness``), else ``chat``."""
    pool: PoolSamplingConfig | None = None
    """``model = "pool:NAME"`` seats: how the opponent is drawn from the pool (default: uniform)."""
    learner: str | None = None
    """A trainable seat another player plays (``sft`` imitating a scripted or frozen one): the ``[policies]`` entry
    that learns from it (default: the only one)."""

    @model_validator(mode="after")
    def _check(self):
        if self.model == "scripted" and self.policy is None:
            raise ValueError("model='scripted' needs `policy` (a function, or 'package.module:factory')")
        check_seat_binding(self)
        if self.trainable is False and self.algo is not None:
            raise ValueError(
                f"the seat names algo {self.algo.type!r} but trainable = false, so the algorithm would never run; "
                "remove `algo` or set trainable = true"
            )
        SamplingParams(**self.sampling)  # unknown keys and bad values fail here, naming the key
        return self

    def scripted_policy(self) -> Callable[..., Any]:
        if callable(self.policy):
            return self.policy
        return import_object(self.policy)(**self.policy_args)


class EnvConfig(_Strict):
    """One environment in the training mix."""

    id: str
    """A registered id (``kuhn_poker``; see [`ENVS`][multiagent_rl.envs.registry.ENVS]) or
    ``"package.module:EnvClass"``."""
    name: str | None = None
    """Label for metrics, traces and RAE baselines; default: ``id`` (suffixed when repeated)."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the environment's constructor."""
    instance: Any = None
    """Python only: an already-built ``Env`` (then ``id`` is just its label)."""
    group_size: int = Field(8, ge=1)
    """Episodes per task (the group credit rules compare)."""
    weight: float = Field(1.0, gt=0)
    """Relative sampling weight among the environments active at a step."""
    algo: OptionalAlgorithm = None
    """This environment's algorithm; default: the experiment's ``[algo]``."""
    roles: dict[str, RoleConfig] = Field(default_factory=dict)
    """Per-seat bindings; seats not listed play the policy and are trained."""
    start_step: int = Field(0, ge=0)
    """First training step at which this environment is sampled (e.g. after a warm-up)."""
    stop_step: int | None = Field(None, ge=1)
    """Step from which it is no longer sampled (e.g. an SFT warm-up phase); None = never stops."""
    tasks: DatasetTasksConfig | None = None
    """Draw this env's tasks from a dataset (``[env.tasks]``: a Hub id, a local file or a ``datasets.Dataset``, with a
    column mapping) instead of its own ``sample_tasks``."""
    timeout: float | None = Field(None, gt=0)
    """Seconds one episode may take before it is recorded as failed; None: the default
    (``multiagent_rl.envs.base.DEFAULT_EPISODE_TIMEOUT``, 600 s); ``inf``: no limit."""

    @model_validator(mode="after")
    def _check(self):
        if self.instance is None:
            ENVS.lookup(self.id)  # an unknown id fails here, listing the registered ones
        if self.stop_step is not None and self.stop_step <= self.start_step:
            raise ValueError(f"env {self.id!r}: stop_step={self.stop_step} must be after start_step={self.start_step}")
        for role, binding in getattr(self.env_class(), "default_roles", {}).items():
            self.roles.setdefault(role, RoleConfig.model_validate(binding))
        return self

    def env_class(self) -> type:
        return type(self.instance) if self.instance is not None else ENVS.lookup(self.id)

    def build(self):
        if self.instance is not None:
            return self.instance
        return self.env_class()(**self.args)

    def default_algo(self) -> dict[str, Any] | None:
        """The environment class's own default algorithm (``Env.default_algo``), if it declares one."""
        return getattr(self.env_class(), "default_algo", None)

    def harness(self, role: str) -> dict[str, Any] | HarnessConfig:
        """How ``role`` converses: its ``[env.roles.<role>] harness``, else the env class's
        ``default_harness[role]``, else the plain chat harness."""
        rc = self.roles.get(role)
        if rc is not None and rc.harness is not None:
            return rc.harness
        return dict(getattr(self.env_class(), "default_harness", {}).get(role, {"id": "chat"}))

    def active(self, step: int) -> bool:
        return self.start_step <= step and (self.stop_step is None or step < self.stop_step)


class ModelConfig(_Strict):
    """The policy being trained."""

    name: str = "tiny"
    """``"tiny"`` (embedded, CPU), a hub id or a local path."""
    lora: dict[str, Any] | None = None
    """PEFT ``LoraConfig`` keyword arguments to train an adapter instead of the full model."""
    backend: Literal["transformers", "vllm"] = "transformers"
    """What samples the policy: the live transformers model (default) or vLLM (``[model.vllm]``)."""
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)
    """vLLM options (used when ``backend = "vllm"``)."""
    prefix_cache_mb: int = Field(1024, ge=0)
    """The transformers backend keeps up to this many MB of keys and values of the conversations so far, so a turn
    encodes only its new tokens (0: every prompt encoded whole)."""
    continuous_batching: bool | None = None
    """The transformers backend lets requests join a running decode between two tokens (None: for a model on a GPU
    only; on a CPU it helps tool-using agents and slows a chat between two local models, docs/speed_results.md)."""

    @property
    def decoding(self) -> dict[str, Any]:
        """The transformers backend's decoding options, as its keyword arguments."""
        return {"prefix_cache_mb": self.prefix_cache_mb, "continuous_batching": self.continuous_batching}


class ExperimentConfig(_Strict):
    """Everything one training run needs."""

    algo: OptionalAlgorithm = None
    """The algorithm of every environment and role that does not name its own; when unset, each environment's
    own default (``Env.default_algo``, e.g. ``hierarchical_grpo`` for the proposer–solver env), else ``grpo``."""
    env: list[EnvConfig]
    """The environments in the mix."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    trainer: dict[str, Any] = Field(default_factory=dict)
    """Fields of [`MixedAlgorithmConfig`][multiagent_rl.training.trainer.MixedAlgorithmConfig] (a TRL ``GRPOConfig``)."""
    endpoints: dict[str, EndpointConfig] = Field(default_factory=dict)
    """Named OpenAI-compatible servers that seats and teachers reach as ``model = "endpoint:NAME"``."""
    regulariser: list[RegulariserField] = Field(default_factory=list)
    """Loss terms added to the streams' loss, in this order (``[[regulariser]] type = "entropy"`` or ``"magnet"``;
    [`multiagent_rl.training.regularisers`][])."""
    phase: list[PhaseConfig] = Field(default_factory=list)
    """Training phases in order (``[[phase]]``); none: every env entry is played by its own ``start_step`` /
    ``stop_step``."""
    policies: dict[str, PolicyConfig] = Field(default_factory=dict)
    """Named learners (``[policies.NAME]``), each trained only on its own seats' traces; none: one policy, named
    ``"policy"``, plays every policy seat (configure it, e.g. its opponent pool, as ``[policies.policy]``)."""

    @field_validator("trainer")
    @classmethod
    def _trainer(cls, v: dict[str, Any]) -> dict[str, Any]:
        if v:
            from .training.arguments import check_trainer_field  # TRL is imported only when there is a field to check

            for key, value in v.items():
                check_trainer_field(key, value)
        return v

    @model_validator(mode="after")
    def _check(self):
        if not self.env:
            raise ValueError("the experiment needs at least one [[env]]")
        if "model" not in self.model_fields_set:
            _warn_default_model()
        self._apply_phases()
        check_policies(self)
        check_trained_temperature(self.trainer.get("temperature", 1.0), "[trainer] temperature")
        for i, env in enumerate(self.env):
            for role, rc in env.roles.items():
                if is_endpoint_reference(rc.model):
                    parse_reference(rc.model, self.endpoints)  # a bad reference fails here, naming it
                self.check_seat(i, role, rc)
            default = self.algorithm_for(env, None)
            if not env.roles and not ALGORITHMS[default.type].samples_from_policy:
                raise ValueError(
                    f"env[{i}] ({env.name or env.id}): algo {default.type!r} needs [env.roles.NAME] bound to a frozen "
                    "model or scripted policy; unlisted seats play the policy"
                )
        return self

    def policy_names(self) -> list[str]:
        """The learners, in config order (``["policy"]`` without ``[policies]``)."""
        return list(self.policies) or [DEFAULT_POLICY]

    def policy_config(self, name: str) -> PolicyConfig:
        """The settings of learner ``name`` (defaults for the one unnamed policy)."""
        return self.policies.get(name) or PolicyConfig()

    @property
    def uses_adapters(self) -> bool:
        """Whether the learners are LoRA adapters on one base named after the policies (several policies, or one
        ``[policies]`` entry with its own ``lora``); otherwise the one policy is trained as before (full model, or
        ``[model] lora`` through TRL's ``peft_config``)."""
        return not self.uses_full_models and (
            len(self.policies) > 1 or any(p.lora is not None for p in self.policies.values()))

    @property
    def uses_full_models(self) -> bool:
        """Whether each learner is a full model of its own (every ``[policies]`` entry names its ``model``)."""
        return len(self.policies) > 1 and all(p.model is not None for p in self.policies.values())

    def policy_base(self, name: str) -> str:
        """The model learner ``name`` starts from: its own ``model``, else ``[model] name`` (which its adapter is on)."""
        return self.policy_config(name).model or self.model.name

    def policy_of_seat(self, env: EnvConfig, role: str) -> str:
        """[`policy_of_seat`][multiagent_rl.policies.policy_of_seat]."""
        return policy_of_seat(self, env, role)

    def _apply_phases(self) -> None:
        apply_phases(self.phase, self.env, env_labels(self))

    def phase_boundaries(self) -> list[tuple[int, int | None, PhaseConfig]]:
        """``(start, stop, phase)`` of every phase (stop None: until the end)."""
        return phase_boundaries(self.phase)

    def check_seat(self, env_index: int, role: str, rc: RoleConfig | None) -> None:
        """Raise a ValueError naming the key and the fix when seat ``role`` of env ``env_index`` cannot train.

        ``rc`` None is a seat the config does not list: it plays the policy with the env's algorithm.
        """
        env = self.env[env_index]
        rc = rc if rc is not None else RoleConfig()
        where = f"env[{env_index}] ({env.name or env.id}) role {role!r}"
        if not self.seat_trainable(env, role):
            return
        algo = self.algorithm_for(env, role)
        spec = ALGORITHMS[algo.type]
        listed = f"[env.roles.{role}]"
        if spec.samples_from_policy and rc.model != "policy":
            raise ValueError(
                f"{where}: algo {algo.type!r} trains on the policy's own samples but the seat is played by "
                f"{rc.model!r}; set trainable = false, bind model = 'policy', or use algo 'sft' to imitate it"
            )
        if not spec.samples_from_policy and rc.model == "policy":
            raise ValueError(
                f"{where}: algo {algo.type!r} imitates a frozen teacher or scripted agent, but the seat samples "
                f"from the policy; bind the seat in {listed} to a frozen model or scripted policy, or choose an "
                "RL algorithm"
            )
        if env.group_size == 1 and spec.needs_group(algo, role):
            raise ValueError(
                f"{where}: algo {algo.type!r} compares the episodes of a task group, but group_size = 1, so every "
                "advantage would be 0; set group_size >= 2 or use 'rae' (a running baseline needs no group)"
            )
        if is_endpoint_reference(rc.model) and parse_reference(rc.model, self.endpoints).kind == "openai":
            raise ValueError(
                f"{where}: a chat endpoint ({rc.model!r}) returns text, re-tokenised here, not the tokens the model "
                "sampled, so its replies cannot be trained on; set trainable = false, or serve the model with vLLM "
                "('vllm:URL#MODEL') for token-exact traces"
            )
        if rc.model == "policy" and rc.sampling.get("temperature") is not None:
            check_trained_temperature(rc.sampling["temperature"], f"{where}: {listed} sampling.temperature")

    def check_env_seats(self, env_index: int, seats: Iterable[str]) -> None:
        """Check env ``env_index`` against the seats its environment really has (listed or not)."""
        env = self.env[env_index]
        seats = tuple(seats)
        unknown = set(env.roles) - set(seats)
        if unknown:
            raise ValueError(
                f"env {env.name or env.id!r} has seats {list(seats)}; [env.roles] names unknown {sorted(unknown)}"
            )
        for role in seats:
            self.check_seat(env_index, role, env.roles.get(role))

    def seat_trainable(self, env: EnvConfig, role: str) -> bool:
        """Whether seat ``role`` of ``env`` is trained (see ``RoleConfig.trainable`` for the default)."""
        rc = env.roles.get(role)
        if rc is None or rc.model == "policy":
            return True if rc is None or rc.trainable is None else rc.trainable
        if rc.trainable is not None:
            return rc.trainable
        return rc.algo is not None or not ALGORITHMS[self.algorithm_for(env, role).type].samples_from_policy

    def algorithm_for(self, env: EnvConfig, role: str | None) -> AlgorithmConfig:
        """The algorithm of seat ``role``: its own, else the env entry's, else the experiment's ``[algo]``, else the
        environment class's ``default_algo``, else ``grpo``."""
        rc = env.roles.get(role) if role is not None else None
        chosen = (rc.algo if rc is not None else None) or env.algo or self.algo
        if chosen is None:
            chosen = parse_algorithm_config(env.default_algo() or {"type": "grpo"})
        return chosen

    @classmethod
    def from_toml(cls, path: str | Path) -> ExperimentConfig:
        with open(path, "rb") as f:
            data = tomllib.load(f)
        return cls.model_validate(data)


@functools.lru_cache(maxsize=1)
def _warn_default_model() -> None:
    logger.warning("the experiment names no [model]: the policy is the embedded 'tiny' model (114k parameters, random "
                   "weights: it cannot read), meant for tests and CPU demonstrations. Set [model] name = 'tiny' to "
                   "silence this, or name a real model ('smollm2-135m', a Hub id, a folder).")


def env_labels(experiment: ExperimentConfig) -> list[str]:
    """Label per env entry: its ``name`` or id, suffixed ``#n`` when the same label appears twice."""
    ids = [spec.name or spec.id for spec in experiment.env]
    return [i if ids.count(i) == 1 else f"{i}#{n}" for n, i in enumerate(ids)]


