"""Learners and their opponent pools, as the experiment config names them (``[policies.NAME]``, ``pool:NAME`` seats).

A run without ``[policies]`` has one learner, ``"policy"``, trained as always (the full model, or ``[model] lora``).
With several, each is a LoRA adapter on the shared base ``[model] name`` or, when every entry names its own ``model``,
a full model of its own; each policy seat names its learner (``[env.roles.ROLE] policy = "NAME"``). A seat ``model = "pool:NAME"`` plays frozen past snapshots of learner NAME
([`multiagent_rl.rollout.pools`][]). The checks here run when the config loads, each error naming the key and the fix.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


POOL_PREFIX = "pool:"


def is_pool_reference(model: str) -> bool:
    """Whether a seat's ``model`` is ``"pool:NAME"`` (past snapshots of policy NAME)."""
    return isinstance(model, str) and model.startswith(POOL_PREFIX)


class PoolSamplingConfig(_Strict):
    """How a ``pool:NAME`` seat draws its opponent for each task group (seeded, checkpointed)."""

    rule: Literal["uniform", "latest", "pfsp"] = "uniform"
    """``uniform`` over every snapshot (fictitious self-play), ``latest`` (uniform over the newest ``k``) or
    ``pfsp`` (prioritised fictitious self-play: weight (1 − w)^``power`` with w the learner's win rate against the
    snapshot, so the snapshots it still loses to are drawn most)."""
    k: int = Field(5, ge=1)
    """``latest``: how many of the newest snapshots."""
    power: float = Field(2.0, ge=0)
    """``pfsp``: the exponent of (1 − win rate)."""


class PolicyConfig(_Strict):
    """One learner (``[policies.NAME]``): a LoRA adapter on the shared base ``[model] name``; a full model of its own
    (``model``); or, when it is the only policy and has neither, the run's one model. Seats bind to it with
    ``policy = "NAME"``."""

    lora: dict[str, Any] | None = None
    """PEFT ``LoraConfig`` keyword arguments of this policy's adapter; default ``[model] lora``."""
    model: str | None = None
    """This policy's own full model, trained whole (``"tiny"``, a hub id or a local path: its starting weights); every
    policy of the run then names one, all with the same tokenizer (e.g. a 135M proposer and a 360M solver of one
    family, or two copies of one base). None: a LoRA adapter on ``[model] name``."""
    learning_rate: float | None = Field(None, gt=0)
    """This policy's learning rate; default ``[trainer] learning_rate`` (the scheduler scales each alike)."""
    snapshot_every: int = Field(0, ge=0)
    """Every this many steps from ``snapshot_start`` a frozen copy of the policy joins its opponent pool, which seats
    play as ``model = "pool:NAME"``; 0: no snapshots (a pool seat then needs a nonzero value)."""
    snapshot_start: int = Field(0, ge=0)
    """The step of the first snapshot (e.g. the end of a warm-up, so the untrained model never joins the pool); a
    pool seat's env must not be active before it."""
    pool_size: int = Field(50, ge=1)
    """Most snapshots kept (the oldest leave first); adapters are small, a full model is a full copy in memory."""


DEFAULT_POLICY = "policy"
"""The name of the one policy of a run without ``[policies]``."""


def check_seat_binding(rc) -> None:
    """Refuse a seat (``RoleConfig``) whose ``policy`` or ``pool`` does not fit its ``model``; a pool seat is never
    trainable."""
    if rc.model not in ("scripted", "policy") and rc.policy is not None:
        raise ValueError(f"`policy` names the learner of a policy seat (or a scripted seat's function); this seat has "
                         f"model={rc.model!r}")
    if rc.model == "policy" and rc.policy is not None and not isinstance(rc.policy, str):
        raise ValueError("a policy seat's `policy` is the name of a [policies] entry (a string)")
    if rc.pool is not None and not is_pool_reference(rc.model):
        raise ValueError(f"`pool` is for model = 'pool:NAME' seats; this seat has model={rc.model!r}")
    if is_pool_reference(rc.model):
        if rc.trainable:
            raise ValueError(f"{rc.model!r}: a pool seat plays past snapshots and is never trained; remove "
                             "trainable = true")
        rc.trainable = False


def learner_of_seat(experiment, env, role: str) -> str:
    """The learner trained on the traces of seat ``role`` of ``env``: a policy seat's policy, else its ``learner``
    (default: the only policy)."""
    rc = env.roles.get(role)
    if rc is None or rc.model == "policy":
        return policy_of_seat(experiment, env, role)
    return rc.learner or experiment.policy_names()[0]


def policy_lora(experiment, name: str) -> dict[str, Any]:
    """The ``LoraConfig`` arguments of learner ``name``'s adapter: its own, else ``[model] lora``."""
    lora = experiment.policy_config(name).lora or experiment.model.lora
    if lora is None:
        raise ValueError(f"[policies.{name}]: several policies train as LoRA adapters on one base model; set "
                         f"[policies.{name}] lora = {{r = 16, target_modules = \"all-linear\"}} (or [model] lora "
                         "for all of them)")
    return lora


def policy_of_seat(experiment, env, role: str) -> str:
    """The learner that plays and learns from policy seat ``role`` of ``env`` (an ``EnvConfig``)."""
    rc = env.roles.get(role)
    named = rc.policy if rc is not None and rc.model == "policy" else None
    names = experiment.policy_names()
    if named is None:
        if len(names) > 1:
            raise ValueError(f"env {env.name or env.id!r} role {role!r} plays a policy but [policies] defines "
                             f"{names}: name one with [env.roles.{role}] policy = \"{names[0]}\"")
        return names[0]
    if named not in names:
        raise ValueError(f"env {env.name or env.id!r} role {role!r}: policy = {named!r} is not in [policies] "
                         f"({names}); add [policies.{named}] or bind one of those")
    return named


def check_full_models(experiment) -> None:
    """Refuse ``[policies.NAME] model`` where the run cannot hold a full model per policy, naming the fix."""
    own = [name for name, p in experiment.policies.items() if p.model is not None]
    if not own:
        return
    if len(experiment.policies) == 1:
        raise ValueError(f"[policies.{own[0]}] model: the only policy is the run's model; set [model] name = "
                         f"{experiment.policies[own[0]].model!r} instead")
    shared = [name for name in experiment.policies if name not in own]
    if shared:
        raise ValueError(f"[policies] {own} name their own full model and {shared} do not: a run's policies are all "
                         f"LoRA adapters on [model] name or all full models; give [policies.{shared[0]}] a model "
                         f"(e.g. model = {experiment.model.name!r}) or drop `model` from the others")
    for name in own:
        if experiment.policies[name].lora is not None:
            raise ValueError(f"[policies.{name}]: `model` (a full model of its own, trained whole) and `lora` (an "
                             "adapter on the shared base) exclude each other; keep one")
    if experiment.model.lora is not None:
        raise ValueError("[model] lora with full-model [policies]: each policy trains its whole model; drop [model] "
                         "lora, or drop `model` from [policies] to train adapters on [model] name")
    if experiment.model.backend == "vllm":
        raise ValueError("[model] backend = 'vllm' with full-model [policies]: vLLM serves several policies as LoRA "
                         "adapters of one base (drop `model` from [policies] and give each a `lora`), or sample "
                         "full-model policies with backend = 'transformers'")


def check_policies(experiment) -> None:
    """Refuse a config whose learners or pool seats cannot train, naming the key and the fix."""
    names = experiment.policy_names()
    check_full_models(experiment)
    if experiment.uses_adapters:
        for name in experiment.policies:
            policy_lora(experiment, name)
    for env in experiment.env:
        for role, rc in env.roles.items():
            where = f"env {env.name or env.id!r} role {role!r}"
            if rc.learner is not None and (rc.model == "policy" or rc.learner not in names):
                raise ValueError(f"{where}: learner = {rc.learner!r} names the [policies] entry that learns from a "
                                 f"seat another player plays; policies: {names}" + (
                                     "; a policy seat names its own with `policy`" if rc.model == "policy" else ""))
            if len(names) > 1 and rc.model != "policy" and rc.learner is None and experiment.seat_trainable(env, role):
                raise ValueError(f"{where}: a trainable seat played by {rc.model!r} (imitation) with several "
                                 f"[policies]: say which one learns from it, learner = \"{names[0]}\"")
            if rc.model == "policy":
                policy_of_seat(experiment, env, role)
            elif is_pool_reference(rc.model):
                target = rc.model[len(POOL_PREFIX):]
                if target not in names:
                    raise ValueError(f"{where}: {rc.model!r} names no policy; policies: {names}")
                config = experiment.policy_config(target)
                if not config.snapshot_every:
                    raise ValueError(f"{where} plays {rc.model!r}, but policy {target!r} takes no snapshots: "
                                     f"set [policies.{target}] snapshot_every = N")
                if env.start_step < config.snapshot_start and not experiment.phase:
                    raise ValueError(f"{where} plays {rc.model!r} from step {env.start_step}, before the first "
                                     f"snapshot (snapshot_start = {config.snapshot_start}): start the env there")
