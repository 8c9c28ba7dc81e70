"""The rollout engine: environments played by their seats, episodes scored by the algorithms.

[`Orchestrator`][multiagent_rl.rollout.engine.Orchestrator] owns everything between a config and a scored episode: the
environments and their seats (bound to the policy, frozen models or scripted functions, and checked against each env's
real seats), the generation backends, the algorithms with the roles each one scores and their saved state, the
task-group → environment map, the episode sink and the run's health checks. It imports nothing from TRL::

    orchestrator = Orchestrator.from_config({"env": [{"id": "kuhn_poker", "group_size": 4}]})
    episodes = orchestrator.play(step=0)        # played and checked on this process
    orchestrator.score(episodes)                 # group credit: per-token streams on the traces

The trainer ([`multiagent_rl.training.trainer`][]) calls the same two methods every step (a gather hook lets group
credit see every process's episodes); a notebook or an evaluation uses it alone."""

from __future__ import annotations

import asyncio
import logging
import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..agents.agent import Agent, AgentConfig, Seat, make_agent
from ..algorithms import Algorithm, AlgorithmContext, build_algorithm
from ..backends import GenerationBackend, SamplingParams, TransformersBackend, build_backend
from ..backends.prefix_cache import clear_prefix_caches
from ..config import POOL_PREFIX, ExperimentConfig, PoolSamplingConfig, env_labels, is_pool_reference
from ..data.sinks import EpisodeSink
from ..envs.base import DEFAULT_EPISODE_TIMEOUT, Env, play_episodes, run_sync
from ..episodes.episode import Episode
from ..policies import learner_of_seat
from ..tasks.datasets import DatasetTasks
from .health import RunHealth
from .pools import build_pools, opponent_metrics, record_results

logger = logging.getLogger(__name__)

Gather = Callable[[list[Episode]], tuple[list[Episode], int]]
"""From this process's episodes: every process's episodes in rank order, and where this process's own
(copies) start in that list. With one process: ``(episodes, 0)``."""


@dataclass
class RolloutStep:
    """One step's episodes, played and scored, as training needs them."""

    step: int
    local: list[Episode]
    """This process's episodes (what it collates and trains on, and what its sink keeps)."""
    everyone: list[Episode]
    """Every process's episodes, in rank order (what group credit and the metrics saw)."""
    tags: list[str]
    """The algorithm tags on this step's scored trainable traces (per-algorithm loss metrics)."""
    streams_of_tag: dict[str, set[str]]
    """Per algorithm tag, the loss streams it writes."""

    def metrics(self) -> dict[str, float]:
        """[`episode_metrics`][multiagent_rl.rollout.engine.episode_metrics] of every process's episodes."""
        return episode_metrics(self.everyone)


@dataclass
class EnvSlot:
    """One ``[[env]]`` entry, bound: its environment, seats, and which algorithm scores which roles."""

    label: str
    env: Env
    agents: dict[str, Any]
    trainable: dict[str, bool]
    assignment: dict[str, set[str]]
    """Algorithm key -> the roles it scores."""
    required_streams: dict[str, list[str]]
    """Stream -> who needs it ("role (algo)"), for the health check."""
    tasks: DatasetTasks | None = None
    """Where its tasks come from when the config names a dataset (``[env.tasks]``); else ``env.sample_tasks``."""
    pool_seats: dict[str, tuple[str, PoolSamplingConfig, AgentConfig]] | None = None
    """Role -> (policy whose pool it plays, the draw rule, its agent's config), for ``model = "pool:NAME"`` seats."""


class Orchestrator:
    """Plays and scores episodes for one process (see the module docstring)."""

    def __init__(
        self,
        experiment: ExperimentConfig | dict,
        policy: GenerationBackend | None = None,
        *,
        policy_model: Any = None,
        device: Any = None,
        seed: int = 0,
        rank: int = 0,
        groups_per_step: int = 4,
        max_concurrency: int = 256,
        sampling: SamplingParams | None = None,
        sink: EpisodeSink | None = None,
        health: RunHealth | None = None,
        policies: dict[str, GenerationBackend] | None = None,
    ):
        self.experiment = experiment if isinstance(experiment, ExperimentConfig) else ExperimentConfig.model_validate(
            experiment)
        self.policy, self.policy_model, self.device = policy, policy_model, device
        names = self.experiment.policy_names()
        self.policies = dict(policies) if policies is not None else ({names[0]: policy} if policy is not None else {})
        """Per learner, the backend its seats sample from (one entry, ``policy``, without ``[policies]``)."""
        if policies is not None and set(policies) != set(names):
            raise ValueError(f"policies {sorted(policies)} do not match the config's [policies] {names}")
        self.pools = build_pools(self.experiment, self.policies)
        """Per policy with ``snapshot_every``, its opponent pool."""
        self.seed, self.rank = seed, rank
        self.groups_per_step, self.max_concurrency = groups_per_step, max_concurrency
        self.sampling = sampling or SamplingParams()
        self.sink, self.health = sink, health or RunHealth()
        self.rng = random.Random(seed * 1000 + rank)
        self.algorithms: dict[str, Algorithm] = {}
        self.slots = [self._bind(i, label) for i, label in enumerate(env_labels(self.experiment))]
        self.slot_of = {slot.label: slot for slot in self.slots}
        self.episodes_played = 0
        self._snapshot_step: int | None = None
        self.last_episodes: list[Episode] = []
        self._warned_silent: set[tuple[str, str]] = set()
        endpoints = self.experiment.endpoints
        ctx = AlgorithmContext(policy_backend=policy, policy_model=policy_model,
                               tokenizer=getattr(policy, "tokenizer", None), temperature=self.sampling.temperature,
                               load_backend=lambda model: build_backend(model, device=device, endpoints=endpoints))
        run_sync(_gather(*(a.setup(ctx) for a in self.algorithms.values())))

    @classmethod
    def from_config(cls, experiment: ExperimentConfig | dict, **kwargs) -> Orchestrator:
        """An orchestrator whose frozen policy ``[model] name`` is loaded here (``[policies]``: one adapter each, or
        each policy's own ``model``)."""
        from ..models.policy_models import load_policies, policy_part

        experiment = ExperimentConfig.model_validate(experiment)
        names = experiment.policy_names()
        model, tok = load_policies(experiment, device=kwargs.get("device"))
        model.eval()
        policies = {}
        for name in names:
            part, adapter = policy_part(experiment, model, name)
            policies[name] = TransformersBackend(part, tok, model_id="policy", policy_name=name, adapter=adapter,
                                                 **experiment.model.decoding)
        return cls(experiment, policies[names[0]], policies=policies, policy_model=model, **kwargs)

    def take_snapshots(self, step: int) -> None:
        """Copy every pooled policy that is due at ``step`` into its pool (once per step)."""
        if self._snapshot_step == step:
            return
        self._snapshot_step = step
        for pool in self.pools.values():
            if pool.due(step):
                pool.take(step)

    # -- binding seats ---------------------------------------------------------------------------
    def _bind(self, index: int, label: str) -> EnvSlot:
        spec = self.experiment.env[index]
        env = spec.build()
        self.experiment.check_env_seats(index, env.roles)
        agents, trainable, assignment, pool_seats = {}, {}, defaultdict(set), {}
        for role in env.roles:
            rc = spec.roles.get(role)
            model = rc.model if rc else "policy"
            config = AgentConfig(
                model="policy" if is_pool_reference(model) else model,
                sampling=self.sampling.with_overrides(**(rc.sampling if rc else {})),
                policy=rc.scripted_policy() if rc and rc.model == "scripted" else None,
                timeout=rc.timeout if rc else None,
                harness=spec.harness(role),
            )
            if is_pool_reference(model):
                target = model[len(POOL_PREFIX):]
                pool_seats[role] = (target, rc.pool or PoolSamplingConfig(), config)
                backend = self.policies.get(target)  # stands in for env.setup; each group draws a snapshot
            elif model == "policy":
                backend = self.policies.get(self.experiment.policy_of_seat(spec, role))
            else:  # a trained scripted seat writes its tokens in its learner's vocabulary, not the tiny model's
                trained = model == "scripted" and self.experiment.seat_trainable(spec, role)
                backend = self.policies.get(learner_of_seat(self.experiment, spec, role)) if trained else None
            agents[role] = make_agent(config, policy_backend=backend, device=self.device,
                                      endpoints=self.experiment.endpoints)
            trainable[role] = self.experiment.seat_trainable(spec, role)
            if trainable[role]:
                algo_config = self.experiment.algorithm_for(spec, role)
                key = algo_config.model_dump_json()
                if key not in self.algorithms:
                    self.algorithms[key] = build_algorithm(algo_config)
                assignment[key].add(role)
        env.setup({role: Seat(agents[role], role, trainable[role]) for role in env.roles})
        required: dict[str, list[str]] = defaultdict(list)
        for key, roles in assignment.items():
            algo = self.algorithms[key]
            for stream in algo.streams_required():
                required[stream].append(f"{'/'.join(sorted(roles))} ({algo.name})")
        tasks = DatasetTasks.from_config(spec.tasks) if spec.tasks is not None else None
        return EnvSlot(label, env, agents, trainable, dict(assignment), dict(required), tasks, pool_seats or None)

    # -- playing -----------------------------------------------------------------------------------
    def play(self, step: int) -> list[Episode]:
        """Play this process's ``groups_per_step`` task groups of step ``step`` (envs drawn by weight among
        the active ones), check them and run the algorithms' per-episode scoring (teachers)."""
        return run_sync(self.aplay(step))

    async def aplay(self, step: int) -> list[Episode]:
        """[`play`][multiagent_rl.rollout.engine.Orchestrator.play] from async code."""
        self.take_snapshots(step)
        specs = self.experiment.env
        active = [i for i, s in enumerate(specs) if s.active(step)]
        if not active:
            raise RuntimeError(f"no environment is active at step {step}: check start_step/stop_step")
        picks = self.rng.choices(active, weights=[specs[i].weight for i in active], k=self.groups_per_step)
        jobs = []
        for g, i in enumerate(picks):
            slot = self.slots[i]
            (task,) = slot.tasks.sample(1, self.rng) if slot.tasks else slot.env.sample_tasks(1, self.rng)
            jobs.append(self._play_group(i, task, f"s{step}-r{self.rank}-g{g}"))
        try:
            episodes = [ep for group in await asyncio.gather(*jobs) for ep in group]
        finally:  # no episode spans two steps, and training needs the memory
            clear_prefix_caches(self.backends())
        self._warn_silent_seats(episodes)
        for ep in episodes:
            self._check(ep)
        await asyncio.gather(*(self.algorithms[key].score_episode(ep, roles)
                               for ep in episodes for key, roles in self.slot_of[ep.env].assignment.items()))
        return episodes

    def backends(self) -> list:
        """Every backend a seat of this orchestrator samples from (policies, partners, pool snapshots)."""
        return [*self.policies.values(), *(a.backend for s in self.slots for a in s.agents.values()),
                *(snap.backend for pool in self.pools.values() for snap in pool.snapshots)]

    async def _play_group(self, index: int, task, group: str) -> list[Episode]:
        spec, slot = self.experiment.env[index], self.slots[index]
        agents, opponents = slot.agents, {}
        if slot.pool_seats:  # one snapshot per pool seat for the whole group: its baseline faces one opponent
            agents = dict(agents)
            for role, (policy, rule, config) in slot.pool_seats.items():
                snapshot = self.pools[policy].draw(rule, self.rng)
                agents[role], opponents[role] = Agent(config, snapshot.backend), snapshot.name
        episodes = await play_episodes(
            slot.env, [task], agents, group_size=spec.group_size, trainable=slot.trainable,
            max_concurrency=self.max_concurrency, groups=[group], seed=str(self.seed),
            timeout=DEFAULT_EPISODE_TIMEOUT if spec.timeout is None else spec.timeout, name=slot.label,
        )
        for ep in episodes:
            if opponents:
                ep.info["opponents"] = dict(opponents)
        return episodes

    def _warn_silent_seats(self, episodes: list[Episode]) -> None:
        """Once per env and seat: a trainable seat that no finished episode of this step has a trace of (its env's
        ``run`` never called it) is neither trained nor in the metrics."""
        for slot in self.slots:
            finished = [ep for ep in episodes if ep.env == slot.label and ep.ok]
            played = {t.role for ep in finished for t in ep.traces}
            for role, trainable in slot.trainable.items():
                if finished and trainable and role not in played and (slot.label, role) not in self._warned_silent:
                    self._warned_silent.add((slot.label, role))
                    logger.warning("env %r: the trainable seat %r has no trace in this step's %d finished episodes: "
                                   "run() never called it, so it is neither trained nor in the metrics. Call "
                                   "agents[%r] in run(), or set [env.roles.%s] trainable = false (warned once)",
                                   slot.label, role, len(finished), role, role)

    def _check(self, episode: Episode) -> None:
        """Fail an episode whose trained traces an algorithm cannot use (no reward, out of range, too long)."""
        if not episode.ok:
            return
        problems = []
        limit = getattr(self.policy, "max_context", None)
        for key, roles in self.slot_of[episode.env].assignment.items():
            for trace in episode.traces:
                if trace.trainable and trace.role in roles:
                    if problem := self.algorithms[key].reward_problem(trace):
                        problems.append(problem)
                    if limit is not None and len(trace.token_ids) > limit:
                        problems.append(f"role {trace.role!r}: trace of {len(trace.token_ids)} tokens exceeds the "
                                        f"policy's context of {limit} positions")
        if problems:
            episode.ok = False
            episode.errors.append(f"env {episode.env!r}: " + "; ".join(problems))

    def step(self, step: int, gather: Gather | None = None, played: list[Episode] | None = None) -> RolloutStep:
        """Play this process's share of step ``step`` (or take it ``played``), score it with everyone's (``gather``)."""
        local = self.play(step) if played is None else played
        everyone = self.score(local, step, gather=gather)
        tags = sorted({t.streams.algorithm for ep in everyone if ep.ok for t in ep.traces
                       if t.trainable and t.streams is not None})
        return RolloutStep(step, self.last_episodes, everyone, tags, self.streams_of_tag())

    def streams_of_tag(self) -> dict[str, set[str]]:
        """Per algorithm tag (``Algorithm.name``), the loss streams it writes."""
        out: dict[str, set[str]] = {}
        for algo in self.algorithms.values():
            out.setdefault(algo.name, set()).update(algo.loss_types)
        return out

    # -- scoring -----------------------------------------------------------------------------------
    def score(self, episodes: list[Episode], step: int = 0, gather: Gather | None = None) -> list[Episode]:
        """Group credit for this step's episodes; returns every process's episodes (``gather``'s result).

        The algorithms see the whole of each task group, in rank order, so their state (RAE's baselines)
        is identical on every process; each process keeps its own scored episodes (``last_episodes``, a
        slice of the result), which go to the sink. Then the run's health is judged on everyone's episodes.
        """
        everyone, start = gather(episodes) if gather is not None else (episodes, 0)
        episodes = everyone[start : start + len(episodes)]
        groups: dict[str, list[Episode]] = defaultdict(list)
        for ep in everyone:
            groups[ep.group].append(ep)
        for group in groups.values():
            for key, roles in self.slot_of[group[0].env].assignment.items():
                self.algorithms[key].score_group(group, roles)
        for ep in everyone:
            self._check_streams(ep)
        self.last_episodes = episodes
        record_results(self.pools, everyone, {s.label: s.pool_seats for s in self.slots if s.pool_seats})
        self.episodes_played += len(everyone)
        if self.sink is not None:
            self.sink.write(episodes, step)
        self.health.after_rollout(everyone, {s.label: s.required_streams for s in self.slots})
        return everyone

    def _check_streams(self, episode: Episode) -> None:
        for key, roles in self.slot_of[episode.env].assignment.items():
            algo = self.algorithms[key]
            for trace in episode.traces:
                if trace.role in roles and (problem := algo.stream_problem(trace)):
                    raise TypeError(problem)

    # -- state ---------------------------------------------------------------------------------------
    def algorithm_state(self) -> dict:
        """The algorithms' state (identical on every process), by algorithm config."""
        return {key: algo.state_dict() for key, algo in self.algorithms.items()}

    def load_algorithm_state(self, state: dict) -> None:
        for key, algo_state in state.items():
            if key in self.algorithms:
                self.algorithms[key].load_state_dict(algo_state)

    def state_dict(self) -> dict:
        """This process's rollout state: its random stream, the environments' samplers, episodes played."""
        version, internal, gauss = self.rng.getstate()
        return {"rng": [version, list(internal), gauss], "episodes_played": self.episodes_played,
                "envs": {slot.label: slot.env.state_dict() for slot in self.slots}}

    def load_state_dict(self, state: dict) -> None:
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.episodes_played = state["episodes_played"]
        for slot in self.slots:
            slot.env.load_state_dict(state["envs"].get(slot.label, {}))


async def _gather(*coros):
    return await asyncio.gather(*coros)


def episode_metrics(episodes: list[Episode]) -> dict[str, float]:
    """Per env, role and algorithm: reward mean/std, advantage mean/std, tokens per stream, the env's own
    trace metrics; per env the number of failed episodes."""
    from ..episodes.streams import STREAMS

    metrics: dict[str, float] = {}
    per_env: dict[str, list[Episode]] = defaultdict(list)
    for ep in episodes:
        per_env[ep.env].append(ep)
    for env, eps in per_env.items():
        metrics[f"{env}/failed_episodes"] = float(sum(not e.ok for e in eps))
        metrics.update(opponent_metrics(env, eps))
        by_key = defaultdict(list)
        for ep in eps:
            if ep.ok:
                for t in ep.traces:
                    by_key[(t.streams.algorithm if t.streams else "untrained", t.role)].append(t)
        for (algo, role), traces in by_key.items():
            prefix = f"{env}/{role}/{algo}"
            rewards = [t.reward for t in traces]
            metrics[f"{prefix}/reward_mean"], metrics[f"{prefix}/reward_std"] = _mean_std(rewards)
            with_rl = [t for t in traces if t.streams is not None and t.streams.advantages is not None]
            if with_rl:
                metrics[f"{prefix}/zero_advantage_share"] = sum(
                    not any(a != 0 for a in t.streams.advantages) for t in with_rl) / len(with_rl)
            for stream in STREAMS:
                values = [w for t in traces if t.streams for w in (getattr(t.streams, stream.field) or [])]
                nonzero = [w for w in values if w != 0]
                metrics[f"{prefix}/tokens_{stream.name}"] = float(len(nonzero))
                if stream.name == "rl" and nonzero:
                    metrics[f"{prefix}/advantage_mean"], metrics[f"{prefix}/advantage_std"] = _mean_std(nonzero)
            for key in sorted({k for t in traces for k in t.metrics}):
                values = [float(t.metrics[key]) for t in traces if key in t.metrics]
                metrics[f"{prefix}/{key}"] = sum(values) / len(values)
    return metrics


def _mean_std(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    return mean, (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5
