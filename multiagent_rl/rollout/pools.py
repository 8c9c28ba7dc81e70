"""Opponent pools: frozen snapshots of a policy that seats play as ``model = "pool:NAME"``.

A policy with ``[policies.NAME] snapshot_every = N`` is copied into its pool at step ``snapshot_start`` (default 0)
and every N steps after it (the oldest copy leaves once ``pool_size`` are kept). A snapshot of a LoRA policy is one more (frozen) adapter on the
shared base; a snapshot of a full model is a full frozen copy in memory. Each task group of an env with a pool seat
draws one snapshot ([`PoolSamplingConfig`][multiagent_rl.config.PoolSamplingConfig]: uniform over the pool, which is
fictitious self-play; the latest k; or prioritised fictitious self-play by the learner's win rate against each), so
the group's episodes, which a group baseline compares, all face the same opponent. The draw uses the rollout's own
seeded random stream; the snapshots' weights and the win counts are saved in checkpoints.

A learner "wins" an episode against a snapshot when its seats' reward exceeds the snapshot's seats' (a tie counts
half): for a two-player zero-sum game that is winning the hand.
"""

from __future__ import annotations

import copy
import os
import random
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ..backends import TransformersBackend
from ..config import PolicyConfig, PoolSamplingConfig
from ..models import adapters


@dataclass
class Snapshot:
    """One frozen past policy: its name (``policy@step``), step, and the backend that plays it."""

    name: str
    step: int
    backend: Any
    wins: float = 0.0
    games: int = 0

    @property
    def win_rate(self) -> float:
        """The learner's win rate against it (½ before any game)."""
        return self.wins / self.games if self.games else 0.5


@dataclass
class OpponentPool:
    """The snapshots of one policy (see the module docstring)."""

    policy: str
    config: PolicyConfig
    model: Any
    """The live policy module: a ``PeftModel`` whose adapter ``policy`` is snapshotted, or a full model copied."""
    tokenizer: Any
    adapter: str | None = None
    """The policy's adapter name when it is one (then snapshots are adapters too); None: full-model copies."""
    snapshots: list[Snapshot] = field(default_factory=list)

    def due(self, step: int) -> bool:
        every, start = self.config.snapshot_every, self.config.snapshot_start
        return (bool(every) and step >= start and (step - start) % every == 0
                and not any(s.step == step for s in self.snapshots))

    def take(self, step: int, state: dict | None = None) -> Snapshot:
        """Copy the policy as it is now (or with ``state``, a saved snapshot's weights) into the pool."""
        name = f"{self.policy}@{step}"
        if self.adapter is not None:
            adapters.add_snapshot(self.model, self.adapter, _adapter_name(name), state)
            backend = TransformersBackend(self.model, self.tokenizer, model_id=f"pool:{self.policy}",
                                          adapter=_adapter_name(name), policy_name=name)
        else:
            frozen = copy.deepcopy(self.model)
            if state is not None:
                frozen.load_state_dict(state)
            frozen.eval().requires_grad_(False)
            backend = TransformersBackend(frozen, self.tokenizer, model_id=f"pool:{self.policy}", policy_name=name)
        snapshot = Snapshot(name, step, backend)
        self.snapshots.append(snapshot)
        while len(self.snapshots) > self.config.pool_size:
            self._drop(self.snapshots.pop(0))
        return snapshot

    def _drop(self, snapshot: Snapshot) -> None:
        if self.adapter is not None:
            adapters.remove_snapshot(self.model, _adapter_name(snapshot.name))

    def draw(self, rule: PoolSamplingConfig, rng: random.Random) -> Snapshot:
        """One snapshot by ``rule`` (uniform, latest-k or PFSP)."""
        if not self.snapshots:
            raise RuntimeError(f"the pool of {self.policy!r} is empty: its first snapshot is at step "
                               f"{self.config.snapshot_start} ([policies.{self.policy}] snapshot_start); start the env "
                               "of its pool seat there (start_step, or a phase)")
        if rule.rule == "latest":
            return rng.choice(self.snapshots[-rule.k:])
        if rule.rule == "pfsp":
            weights = [(1.0 - s.win_rate) ** rule.power for s in self.snapshots]
            if sum(weights) > 0:
                return rng.choices(self.snapshots, weights=weights, k=1)[0]
        return rng.choice(self.snapshots)

    def record(self, name: str, outcome: float) -> None:
        """The learner's result of one episode against snapshot ``name`` (1 win, ½ tie, 0 loss)."""
        for snapshot in self.snapshots:
            if snapshot.name == name:
                snapshot.wins += outcome
                snapshot.games += 1

    # -- checkpoints -------------------------------------------------------------------------------
    def save(self, folder: str) -> dict:
        """Write every snapshot's weights under ``folder`` and return the pool's index (names, steps, results)."""
        from safetensors.torch import save_file

        os.makedirs(folder, exist_ok=True)
        for s in self.snapshots:
            state = (adapters.adapter_state(self.model, _adapter_name(s.name)) if self.adapter is not None
                     else s.backend.model.state_dict())
            save_file({k: v.detach().cpu().clone().contiguous() for k, v in state.items()},  # tied weights: copies
                      os.path.join(folder, f"{_adapter_name(s.name)}.safetensors"))
        return {"snapshots": [{"name": s.name, "step": s.step, "wins": s.wins, "games": s.games}
                              for s in self.snapshots]}

    def load(self, folder: str, index: dict) -> None:
        """Replace the pool by the saved one (``save``'s folder and index)."""
        from safetensors.torch import load_file

        for s in self.snapshots:
            self._drop(s)
        self.snapshots = []
        device = next(self.model.parameters()).device
        for entry in index["snapshots"]:
            state = load_file(os.path.join(folder, f"{_adapter_name(entry['name'])}.safetensors"), device=str(device))
            snapshot = self.take(entry["step"], state)
            snapshot.wins, snapshot.games = entry["wins"], entry["games"]


def build_pools(experiment, policies: dict) -> dict[str, OpponentPool]:
    """Per learner with ``snapshot_every``, its (empty) pool over the live module its backend in ``policies`` serves."""
    pools = {}
    for name in experiment.policy_names():
        config = experiment.policy_config(name)
        if not config.snapshot_every:
            continue
        backend = policies.get(name)
        model = getattr(backend, "model", None)
        if model is None:
            raise ValueError(f"[policies.{name}] snapshot_every: opponent pools copy the live transformers policy; "
                             "this run's policy has no module here (a served policy); use backend = 'transformers'")
        adapter = getattr(backend, "adapter", None)
        if adapter is None and hasattr(model, "peft_config"):  # [model] lora through TRL: its one adapter
            adapter = model.active_adapter
            if not adapters.trained_adapters(model):
                setattr(model, adapters.TRAINED, [adapter])
        pools[name] = OpponentPool(name, config, model, backend.tokenizer, adapter=adapter)
    return pools


def record_results(pools: dict[str, OpponentPool], episodes, pool_seats: dict[str, dict]) -> None:
    """Count each finished episode's result against the snapshots it was played with (``episode.info["opponents"]``;
    ``pool_seats``: env label → role → (policy, rule, agent config))."""
    for ep in episodes:
        opponents = ep.info.get("opponents") if ep.ok else None
        outcome = learner_outcome(ep, set(opponents)) if opponents else None
        if outcome is None:
            continue
        for role, name in opponents.items():
            pools[pool_seats[ep.env][role][0]].record(name, outcome)


def opponent_metrics(env: str, episodes) -> dict[str, float]:
    """Per snapshot faced in ``episodes`` (of env label ``env``): the learner's mean reward and win rate."""
    against = defaultdict(list)
    for ep in episodes:
        for role, name in (ep.info.get("opponents") or {}).items() if ep.ok else ():
            outcome = learner_outcome(ep, {role})
            if outcome is not None:
                against[name].append((sum(t.reward for t in ep.traces if t.trainable), outcome))
    metrics = {}
    for name, results in against.items():
        metrics[f"{env}/opponent/{name}/learner_reward"] = sum(r for r, _ in results) / len(results)
        metrics[f"{env}/opponent/{name}/win_rate"] = sum(w for _, w in results) / len(results)
    return metrics


def _adapter_name(snapshot: str) -> str:
    return snapshot.replace("@", "_at_")


def learner_outcome(episode, opponent_roles: set[str]) -> float | None:
    """1, ½ or 0: whether the learner's seats outscored the pool seats ``opponent_roles`` in ``episode`` (None when
    either side has no trace)."""
    mine = [t.reward for t in episode.traces if t.role not in opponent_roles and t.trainable]
    theirs = [t.reward for t in episode.traces if t.role in opponent_roles]
    if not mine or not theirs:
        return None
    a, b = sum(mine), sum(theirs)
    return 1.0 if a > b else 0.5 if a == b else 0.0


__all__ = ["OpponentPool", "Snapshot", "build_pools", "learner_outcome", "opponent_metrics", "record_results"]
