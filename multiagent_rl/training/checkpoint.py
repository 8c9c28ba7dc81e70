"""What a checkpoint holds beyond TRL's model, optimizer, scheduler and random states.

- ``rollout_state_rank{r}.json``: each process's rollout random stream, its environments' sampler
  state and the episode count ([`Orchestrator.state_dict`][multiagent_rl.rollout.engine.Orchestrator.state_dict]);
- ``algorithms_state.json``: the algorithms' state, identical on every process (e.g. RAE's baselines);
- ``callbacks_state.json``: the state of every trainer callback with ``state_dict()`` /
  ``load_state_dict()`` (e.g. an evaluation's running average);
- ``pools/``: every opponent pool's snapshots (``pools/NAME/*.safetensors``) and ``pools/pools.json``, their
  steps and the learner's results against each ([`multiagent_rl.rollout.pools`][]).

Together they let a resumed run continue exactly as an uninterrupted one.
"""

from __future__ import annotations

import json
import os
from typing import Any

ALGORITHM_STATE_FILE = "algorithms_state.json"
ROLLOUT_STATE_FILE = "rollout_state_rank{rank}.json"
CALLBACK_STATE_FILE = "callbacks_state.json"
POOLS_FOLDER = "pools"


def stateful(callbacks) -> dict[str, Any]:
    """The callbacks that carry state, by class name."""
    return {type(cb).__name__: cb for cb in callbacks if hasattr(cb, "state_dict") and hasattr(cb, "load_state_dict")}


def save_run_state(folder: str, rollout, callbacks, rank: int, main_process: bool, ahead=None, step: int = 0) -> None:
    """Write this process's rollout state (and, on the main process, the shared state) into ``folder``; with rollouts
    ahead (``ahead``), the rollout state as it was before step ``step`` (the next to train) drew anything."""
    state = ahead.rollout_state(step) if ahead is not None else rollout.state_dict()
    _write_json(os.path.join(folder, ROLLOUT_STATE_FILE.format(rank=rank)), state)
    if main_process:
        _write_json(os.path.join(folder, ALGORITHM_STATE_FILE), rollout.algorithm_state())
        if rollout.pools:
            pools = os.path.join(folder, POOLS_FOLDER)
            index = {name: pool.save(os.path.join(pools, name)) for name, pool in rollout.pools.items()}
            _write_json(os.path.join(pools, "pools.json"), index)
        _write_json(os.path.join(folder, CALLBACK_STATE_FILE),  # written last: a complete checkpoint has it
                    {name: cb.state_dict() for name, cb in stateful(callbacks).items()})


def load_run_state(folder: str, rollout, callbacks, rank: int) -> None:
    """Restore what [`save_run_state`][multiagent_rl.training.checkpoint.save_run_state] wrote (refusing a checkpoint that lacks
    this process's rollout state)."""
    path = os.path.join(folder, ROLLOUT_STATE_FILE.format(rank=rank))
    if not os.path.exists(path):
        raise ValueError(f"{folder} has no {os.path.basename(path)}: it was not written by this trainer (or by a "
                         "run with another number of processes), so the run cannot resume exactly")
    rollout.load_state_dict(_read_json(path))
    rollout.load_algorithm_state(_read_json(os.path.join(folder, ALGORITHM_STATE_FILE)))
    if rollout.pools:
        pools = os.path.join(folder, POOLS_FOLDER)
        index = _read_json(os.path.join(pools, "pools.json"))
        for name, pool in rollout.pools.items():
            if name not in index:
                raise ValueError(f"{folder} has no opponent pool of {name!r} (it was saved by a run without "
                                 f"[policies.{name}] snapshot_every), so the run cannot resume exactly")
            pool.load(os.path.join(pools, name), index[name])
    saved = _read_json(os.path.join(folder, CALLBACK_STATE_FILE))
    for name, cb in stateful(callbacks).items():
        if name in saved:
            cb.load_state_dict(saved[name])


def _write_json(path: str, data) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _read_json(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)
