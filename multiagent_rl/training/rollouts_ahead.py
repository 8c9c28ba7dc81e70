"""Rollouts ahead of training: step k + 1's episodes are played while step k trains (``async_rollouts = N``).

A background thread plays steps in order. It samples from a copy of the policy whose weights it refreshes, before each
rollout, from the newest weights the trainer has published (the trainable parameters, copied at the start of every
step); rollout ``j`` is scheduled only once step ``j − N`` has published, so every batch is sampled at most ``N``
optimizer steps behind the weights it trains (its ``lag``, logged as ``rollout/lag``). The
trainer then weighs each sampled token by the truncated importance ratio of the current policy to the one that sampled
it ([`importance_weights`][multiagent_rl.training.loss.importance_weights], the correction it applies to any sampler
that is not the trainer itself). Group credit, the episode log and the health checks stay on the training thread, in
step order, so the data a step trains on is what an on-policy run would have played, only sampled earlier.

``N = 0`` (the default) is on-policy: no thread, no copy, the behaviour of a run without the option.
"""

from __future__ import annotations

import asyncio
import copy
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from ..backends.prefix_cache import clear_prefix_caches
from ..envs.base import run_sync
from ..episodes.episode import Episode
from ..rollout.engine import RolloutStep


class RolloutsAhead:
    """Plays the rollouts of the next ``max_lag`` steps in a background thread (see the module docstring).

    ``policies`` are the orchestrator's policy backends; those that sample the live model (or a model in it) are moved
    onto the copy, and every other one (a vLLM engine or server) is handed the copy's weights before each rollout.
    """

    def __init__(self, orchestrator, live_model: Any, max_lag: int, max_steps: int):
        if max_lag < 1:
            raise ValueError(f"async_rollouts={max_lag}: rollouts ahead need a lag of at least 1")
        if orchestrator.pools:
            raise ValueError(f"async_rollouts={max_lag} with opponent pools ([policies.*] snapshot_every): a snapshot "
                             "would copy weights the trainer is writing; set async_rollouts = 0 for pool runs")
        self.orchestrator, self.live, self.max_lag, self.max_steps = orchestrator, live_model, max_lag, max_steps
        self.copy = copy.deepcopy(live_model).eval()
        for p in self.copy.parameters():
            p.requires_grad_(False)
        copies = dict(self.copy.named_modules())
        for backend in orchestrator.policies.values():  # the live module or, full-model policies, one model in it
            path = next((path for path, module in live_model.named_modules()
                         if module is getattr(backend, "model", None)), None)
            if path is not None:
                backend.model = copies[path]
        self.trained = [name for name, p in live_model.named_parameters() if p.requires_grad]
        self.copy_params = dict(self.copy.named_parameters())
        self.published: tuple[int, dict[str, torch.Tensor]] | None = None
        self.loaded_version: int | None = None
        self.pool: ThreadPoolExecutor | None = None
        self.futures: dict[int, Future] = {}
        self.lags: dict[int, int] = {}
        self.states: dict[int, dict] = {}
        """Per step whose rollout has started, the orchestrator's state just before it drew anything."""
        self.in_flight: tuple[asyncio.AbstractEventLoop, asyncio.Task] | None = None
        """The rollout being played (its thread's loop and task), which ``close`` cancels."""
        self.lock = threading.Lock()

    @classmethod
    def for_run(cls, orchestrator, live_model: Any, args, sharded: bool = False) -> RolloutsAhead | None:
        """The rollouts ahead of a run with ``args.async_rollouts`` > 0 (else None: on-policy)."""
        if args.async_rollouts and sharded:
            raise ValueError(f"async_rollouts={args.async_rollouts} copies the policy for its thread, which FSDP and "
                             "DeepSpeed ZeRO-3 shard across processes: use DDP or ZeRO-2, or async_rollouts = 0")
        return cls(orchestrator, live_model, args.async_rollouts, args.max_steps) if args.async_rollouts else None

    def episodes(self, step: int) -> tuple[list[Episode], int]:
        """Step ``step``'s played episodes and their lag (optimizer steps between the weights that sampled them and
        the ones about to train on them). Publishes the current weights first and schedules the steps ahead."""
        self.publish(step)
        if self.pool is None:
            self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollouts-ahead")
        for j in range(step, min(step + self.max_lag, self.max_steps - 1) + 1):
            if j not in self.futures:
                self.futures[j] = self.pool.submit(self._play, j)
        episodes = self.futures.pop(step).result()
        with self.lock:
            self._forget_states_before(step)
        return episodes, step - self.lags.pop(step)

    def publish(self, step: int) -> None:
        """The live trainable weights, as they are at the start of ``step``, for the rollouts to come."""
        params = dict(self.live.named_parameters())
        with torch.no_grad():
            self.published = (step, {name: params[name].detach().clone() for name in self.trained})

    def rollout_state(self, step: int) -> dict:
        """The orchestrator's state before rollout ``step`` drew its tasks (what a checkpoint taken before training
        step ``step`` must hold, although the thread may have played on since)."""
        with self.lock:
            self._forget_states_before(step)
            return self.states[step] if step in self.states else self.orchestrator.state_dict()

    def _forget_states_before(self, step: int) -> None:
        for done in [j for j in self.states if j < step]:
            del self.states[done]

    def _play(self, step: int) -> list[Episode]:
        with self.lock:
            self.states[step] = self.orchestrator.state_dict()
        version, state = self.published  # at least step - max_lag: the rollout was scheduled after that step published
        if version != self.loaded_version:
            with torch.no_grad():
                for name, tensor in state.items():
                    self.copy_params[name].copy_(tensor)
            self.loaded_version = version
            for backend in self.orchestrator.policies.values():
                if getattr(backend, "model", None) is not self.copy:
                    backend.sync_weights(self.copy)
        self.lags[step] = version

        async def play() -> list[Episode]:
            with self.lock:
                self.in_flight = (asyncio.get_running_loop(), asyncio.current_task())
            try:
                return await self.orchestrator.aplay(step)
            finally:
                with self.lock:
                    self.in_flight = None

        return run_sync(play())

    def close(self) -> None:
        """Stop scheduling and cancel the rollout in flight (its episodes would be dropped anyway): a run that ends
        or is interrupted does not wait for a rollout no step will train on."""
        for future in self.futures.values():
            future.cancel()
        with self.lock:
            if self.in_flight is not None:
                loop, task = self.in_flight
                loop.call_soon_threadsafe(task.cancel)
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        self.pool = None
        self.futures.clear()
        self.lags.clear()


def play_and_score(trainer, step: int, policy) -> tuple[RolloutStep, int]:
    """The trainer's step ``step`` played and scored, and its lag: on-policy (every policy's sampler gets the weights
    first, once per optimizer step) or from the rollouts ahead (``trainer.ahead``; its lag logged as ``rollout/lag``)."""
    clear_prefix_caches(trainer.live_policies.values())  # what evaluations kept: stale from this step on
    if trainer.ahead is not None:
        played, lag = trainer.ahead.episodes(step)
        trainer.record_metric("rollout/lag", lag)
        return trainer.rollout.step(step, gather=trainer._gather, played=played), lag
    if trainer._synced_step != step:
        for backend in trainer.rollout.policies.values():
            backend.sync_weights(policy)
        trainer._synced_step = step
    return trainer.rollout.step(step, gather=trainer._gather), 0
