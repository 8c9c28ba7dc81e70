"""Environments: async Python programs over agents, and the runner that plays many at once.

Write an environment as the script of one game or conversation::

    class Echo(Env):
        roles = ("agent",)

        async def run(self, task, agents):
            trace = await agents["agent"].run(task)
            trace.add_reward("match", float(trace.last_reply == task.data.answer))

The base class plays it: every finished agent run joins the :class:`Episode`, stamped with its
role and trainability, and an exception or timeout inside one episode is recorded on that episode
(``ok=False``, ``errors``) while the others go on.
"""

from __future__ import annotations

import asyncio
import random
import traceback
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from .agent import Agent, Seat
from .episode import Episode
from .task import Task, TaskData
from .trace import Trace


class Env:
    """Base class of every environment. Subclasses set ``roles`` and write ``run``."""

    name: str = "env"
    roles: tuple[str, ...] = ("agent",)

    def setup(self, agents: dict[str, Agent]) -> None:
        """Called once with the agents bound to the seats, before any episode."""

    async def run(self, task: Task, agents: dict[str, Seat]) -> None:
        """Play one episode on ``task``. Record rewards on traces (here or in ``finalize``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement `async def run(self, task, agents)`")

    def finalize(self, task: Task, episode: Episode) -> None:
        """Called after ``run`` with the complete episode: a place for rewards that need every trace."""

    def sample_tasks(self, num: int, rng: random.Random) -> list[Task]:
        """Tasks for training; environments with a dataset or a generator override this."""
        raise NotImplementedError(f"{type(self).__name__} has no task source: override sample_tasks()")

    async def play(
        self,
        task: Task,
        agents: dict[str, Agent],
        *,
        trainable: dict[str, bool] | None = None,
        group: str = "",
        episode_id: str | None = None,
        timeout: float | None = None,
    ) -> Episode:
        """Run one episode, isolating failures. Never raises for errors inside the episode."""
        missing = set(self.roles) - set(agents)
        if missing:
            raise ValueError(f"{type(self).__name__} needs agents for seats {sorted(missing)}; got {sorted(agents)}")
        trainable = trainable or {}
        episode = Episode(id=episode_id or uuid.uuid4().hex[:12], task=task, group=group, env=self.name)
        seats = {role: Seat(agents[role], role, trainable.get(role, False), episode.traces) for role in self.roles}
        try:
            await asyncio.wait_for(self.run(task, seats), timeout=timeout)
            self.finalize(task, episode)
        except Exception as exc:  # one broken episode is recorded, never fatal to the run
            episode.ok = False
            kind = "timeout" if isinstance(exc, (asyncio.TimeoutError, TimeoutError)) else type(exc).__name__
            episode.errors.append(f"{kind}: {exc}\n{traceback.format_exc(limit=4)}")
        return episode


class SingleAgentEnv(Env):
    """One seat, one reply per task, a reward function: a plain task set as an environment.

    >>> env = SingleAgentEnv([TaskData(prompt="2+2?", answer="4")], reward=lambda task, trace: float("4" in trace.last_reply))
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
    timeout: float | None = None,
    progress: bool | str = False,
) -> list[Episode]:
    """Play ``len(tasks) × group_size`` episodes concurrently (at most ``max_concurrency`` at a time).

    Episodes of the same task share ``episode.group``; the result keeps task order, then group order.
    """
    from tqdm.auto import tqdm

    semaphore = asyncio.Semaphore(max_concurrency)
    bar = tqdm(total=len(tasks) * group_size, desc=progress if isinstance(progress, str) else env.name,
               disable=not progress, leave=False)

    async def one(task: Task, group: str, k: int) -> Episode:
        async with semaphore:
            ep = await env.play(task, agents, trainable=trainable, group=group, episode_id=f"{group}-{k}",
                                timeout=timeout)
        bar.update(1)
        return ep

    jobs = []
    for task in tasks:
        group = uuid.uuid4().hex[:10]
        jobs += [one(task, group, k) for k in range(group_size)]
    try:
        return list(await asyncio.gather(*jobs))
    finally:
        bar.close()


def run_sync(coro):
    """Run a coroutine from sync code, also where an event loop is already running (Jupyter, Colab)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    # A notebook's loop is busy running the cell: run ours in a worker thread with its own loop.
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()
