"""Environments: async Python programs over agents, and the runner that plays many at once.

Write an environment as the script of one game or conversation::

    class Echo(Env):
        roles = ("agent",)

        async def run(self, task, agents):
            trace = await agents["agent"].run(task)
            trace.add_reward("match", float(trace.last_reply == task.data.answer))

The base class plays it: every finished agent run joins the [`Episode`][multiagent_rl.episodes.episode.Episode], stamped with its
role and trainability, and an exception or timeout inside one episode is recorded on that episode
(``ok=False``, ``errors``) while the others go on.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
import random
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from ..agents.agent import Agent, Seat
from ..episodes.episode import Episode
from ..episodes.trace import Trace
from ..tasks.task import Task, TaskData

logger = logging.getLogger(__name__)

DEFAULT_EPISODE_TIMEOUT = 600.0
"""Seconds one episode may take by default before it is recorded as failed (``math.inf`` or None: no limit)."""

BLOCKING_WARNING_SECONDS = 1.0
"""An environment whose code runs this long without yielding to the event loop gets a warning: it stalls
every concurrent episode (and no timeout can interrupt it). Run blocking work with ``asyncio.to_thread``."""


class Env:
    """Base class of every environment. Subclasses set ``roles`` and write ``run``."""

    name: str = "env"
    roles: tuple[str, ...] = ("agent",)
    default_algo: dict[str, Any] | None = None
    """The algorithm config used for this env when neither the config's env entry nor ``[algo]`` names one."""
    default_roles: dict[str, dict[str, Any]] = {}
    """Per role, the ``[env.roles.<role>]`` binding used when the config gives none (e.g. a scripted, untrained
    simulated user); roles not listed play the policy and are trained."""
    reward_ranges: dict[str, tuple[float, float]] = {}
    """Per reward name, the inclusive range its values must lie in (e.g. ``{"tests": (0.0, 1.0)}``): a recorded
    value outside fails the episode, with the reason in its errors, instead of being trained on."""
    default_harness: dict[str, dict[str, Any]] = {}
    """Per role, the harness used when the config's ``[env.roles.<role>] harness`` is not set (e.g.
    ``{"judge": {"id": "tools"}}``); roles not listed converse with the plain chat harness."""

    def setup(self, seats: dict[str, Seat]) -> None:
        """Called once, before any episode, with the seats as bound (the same kind of object ``run`` gets;
        these record nothing): a place to read each seat's agent, model or trainability."""

    async def run(self, task: Task, agents: dict[str, Seat]) -> None:
        """Play one episode on ``task``. Record rewards on traces (here or in ``finalize``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement `async def run(self, task, agents)`")

    def finalize(self, task: Task, episode: Episode) -> None:
        """Called after ``run`` with the complete episode: a place for rewards that need every trace. May be
        ``async def`` (then it is awaited, within the episode's timeout)."""

    def sample_tasks(self, num: int, rng: random.Random) -> list[Task]:
        """Tasks for training; environments with a dataset or a generator override this.

        Draw every random choice from ``rng`` (the trainer saves and restores it with checkpoints);
        keep any other sampler state in [`state_dict`][multiagent_rl.envs.base.Env.state_dict].
        """
        raise NotImplementedError(
            f"{type(self).__name__} has no task source: override sample_tasks(num, rng) to train on it"
        )

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state of the task sampler (e.g. a curriculum) saved in checkpoints. Default: none."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what [`state_dict`][multiagent_rl.envs.base.Env.state_dict] returned. Default: nothing."""

    async def play(
        self,
        task: Task,
        agents: dict[str, Agent],
        *,
        trainable: dict[str, bool] | None = None,
        group: str = "",
        episode_id: str | None = None,
        timeout: float | None = DEFAULT_EPISODE_TIMEOUT,
        seed: str | None = None,
        name: str | None = None,
    ) -> Episode:
        """Run one episode, isolating failures. Never raises for errors inside the episode.

        ``timeout`` bounds the whole episode in seconds (None or ``math.inf``: no limit). ``seed``
        seeds the random streams scripted seats draw from (``ScriptedTurn.rng``). ``name`` labels the
        episode and its errors (default: the env's ``name``; the trainer passes the config's label).
        """
        name = name or self.name
        missing = set(self.roles) - set(agents)
        if missing:
            raise ValueError(f"{type(self).__name__} needs agents for seats {sorted(missing)}; got {sorted(agents)}")
        trainable = trainable or {}
        episode = Episode(id=episode_id or uuid.uuid4().hex[:12], task=task, group=group, env=name)
        seats = Seats(name, {
            role: Seat(agents[role], role, trainable.get(role, False), episode.traces,
                       seed=None if seed is None else f"{seed}/{episode.id}")
            for role in self.roles
        })
        limit = None if timeout is None or math.isinf(timeout) else timeout
        deadline = asyncio.timeout(limit)
        try:
            async with deadline:
                await _WatchBlocking(self.run(task, seats), name)
                started = time.perf_counter()
                finalized = self.finalize(task, episode)
                _warn_if_blocking(name, time.perf_counter() - started, "finalize()")
                if inspect.isawaitable(finalized):  # `async def finalize`: awaited, within the episode's timeout
                    await finalized
            problems = [p for t in episode.traces if (p := t.reward_problem(self.reward_ranges))]
            if problems:
                raise ValueError("; ".join(problems))
        except Exception as exc:  # one broken episode is recorded, never fatal to the run
            episode.ok = False
            if deadline.expired():
                waiting = sorted(role for role, seat in seats.items() if seat.waiting)
                on = f", waiting for a reply from {', '.join(map(repr, waiting))}" if waiting else ""
                episode.errors.append(
                    f"env {name!r}: episode timed out after {limit:g} s{on} (the env's `timeout`; "
                    f"default {DEFAULT_EPISODE_TIMEOUT:g} s)"
                )
            else:
                episode.errors.append(f"env {name!r}: {format_error(exc)}")
        return episode

class Seats(dict):
    """The seats ``run`` gets, by role; a role the env does not have is a ``KeyError`` that names the env's seats."""

    def __init__(self, env: str, seats: dict):
        super().__init__(seats)
        self.env = env

    def __missing__(self, role):
        raise KeyError(f"env {self.env!r} has no seat {role!r}; its seats are {list(self)} (the env's `roles`)")


class SingleAgentEnv(Env):
    """One seat, one reply per task, a reward function: a plain task set as an environment.

    ```pycon
    >>> env = SingleAgentEnv([TaskData(prompt="2+2?", answer="4")], reward=lambda task, trace: float("4" in trace.last_reply))

    ```
    """

    def __init__(
        self,
        tasks: Sequence[TaskData | dict[str, Any]],
        reward: Callable[[Task, Trace], float],
        role: str = "agent",
        name: str = "single_agent",
    ):
        self.tasks = [t if isinstance(t, TaskData) else TaskData(**t) for t in tasks]
        if not self.tasks:
            raise ValueError("SingleAgentEnv needs at least one task")
        self.reward = reward
        self.roles = (role,)
        self.name = name

    async def run(self, task: Task, agents: dict[str, Seat]) -> None:
        trace = await agents[self.roles[0]].run(task)
        trace.add_reward("reward", float(self.reward(task, trace)))

    def sample_tasks(self, num: int, rng: random.Random) -> list[Task]:
        return [Task(rng.choice(self.tasks)) for _ in range(num)]


async def play_episodes(
    env: Env,
    tasks: Sequence[Task],
    agents: dict[str, Agent],
    *,
    group_size: int = 1,
    trainable: dict[str, bool] | None = None,
    max_concurrency: int = 256,
    timeout: float | None = DEFAULT_EPISODE_TIMEOUT,
    progress: bool | str = False,
    seed: str | None = None,
    groups: Sequence[str] | None = None,
    name: str | None = None,
) -> list[Episode]:
    """Play ``len(tasks) × group_size`` episodes concurrently (at most ``max_concurrency`` at a time).

    Episodes of the same task share ``episode.group`` (``groups[i]`` for task i, default a random id)
    and are numbered ``f"{group}-{k}"``; the result keeps task order, then group order. ``timeout``
    bounds each episode (default [`DEFAULT_EPISODE_TIMEOUT`][multiagent_rl.envs.base.DEFAULT_EPISODE_TIMEOUT]; None: no
    limit); ``seed`` makes scripted seats' random streams reproducible; ``name`` labels the episodes.
    """
    if groups is not None and len(groups) != len(tasks):
        raise ValueError(f"groups names {len(groups)} groups for {len(tasks)} tasks")
    from tqdm.auto import tqdm

    semaphore = asyncio.Semaphore(max_concurrency)
    bar = tqdm(total=len(tasks) * group_size, desc=progress if isinstance(progress, str) else env.name,
               disable=not progress, leave=False)

    async def one(task: Task, group: str, k: int) -> Episode:
        async with semaphore:
            ep = await env.play(task, agents, trainable=trainable, group=group, episode_id=f"{group}-{k}",
                                timeout=timeout, seed=seed, name=name)
        bar.update(1)
        return ep

    jobs = []
    for i, task in enumerate(tasks):
        group = groups[i] if groups is not None else uuid.uuid4().hex[:10]
        jobs += [one(task, group, k) for k in range(group_size)]
    try:
        return list(await asyncio.gather(*jobs))
    finally:
        bar.close()


_RUNNERS = threading.local()


def run_sync(coro):
    """Run a coroutine from sync code, also where an event loop is already running (Jupyter, Colab).

    Every call from the same thread runs on the same event loop (an ``asyncio.Runner`` kept per thread), so
    backends that hold loop-bound resources (HTTP clients, queues) keep them from one training step to the next.
    In a notebook, whose loop is busy running the cell, the coroutine runs on a worker thread's own loop.
    """
    try:
        asyncio.get_running_loop()
        in_loop = True
    except RuntimeError:
        in_loop = False
    if not in_loop:  # outside the except block, so errors raised inside carry no "no running event loop" context
        return _runner().run(coro)
    return _notebook_pool().submit(lambda: _runner().run(coro)).result()


def _runner() -> asyncio.Runner:
    runner = getattr(_RUNNERS, "runner", None)
    if runner is None:
        runner = _RUNNERS.runner = asyncio.Runner()
    return runner


@functools.lru_cache(maxsize=1)
def _notebook_pool():
    import concurrent.futures

    return concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="multiagent_rl-loop")


def format_error(exc: BaseException, frames: int = 5) -> str:
    """``"Type: message"`` plus the innermost ``frames`` of the traceback, without chained exceptions."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-frames, chain=False))
    return f"{type(exc).__name__}: {exc}\n{tb}"


_warned_blocking: set[str] = set()


def _warn_if_blocking(env: str, seconds: float, where: str) -> None:
    if seconds >= BLOCKING_WARNING_SECONDS and env not in _warned_blocking:
        _warned_blocking.add(env)
        logger.warning(
            "env %r: %s ran %.1f s without yielding to the event loop; every concurrent episode waited and no "
            "timeout can interrupt it. Await slow work (`await asyncio.to_thread(fn, ...)`) instead of blocking. "
            "(Warned once per env.)", env, where, seconds,
        )


class _WatchBlocking:
    """Drive a coroutine step by step, timing how long each step runs before it yields.

    The time a step takes is time the event loop was blocked by this coroutine's own synchronous
    code (requests awaited on a backend run elsewhere), so a slow step is attributed to its env.
    """

    def __init__(self, coro, env: str):
        self.coro, self.env = coro, env

    def __await__(self):
        it = self.coro.__await__()
        send, value = it.send, None
        while True:
            started = time.perf_counter()
            try:
                yielded = send(value)
            except StopIteration as stop:
                _warn_if_blocking(self.env, time.perf_counter() - started, "run()")
                return stop.value
            _warn_if_blocking(self.env, time.perf_counter() - started, "run()")
            try:
                value = yield yielded
                send = it.send
            except GeneratorExit:
                it.close()
                raise
            except BaseException as exc:  # cancellation and other exceptions thrown in go to the coroutine
                value, send = exc, it.throw
