"""Where played episodes go: the episode log.

An [`EpisodeSink`][multiagent_rl.data.sinks.EpisodeSink] receives every step's episodes (``write``) and, when a run resumes
from a checkpoint at step k, forgets what it received for steps ≥ k (``resume``), so each episode is kept
exactly once. [`JsonlEpisodeSink`][multiagent_rl.data.sinks.JsonlEpisodeSink] writes one JSON line per episode to
``output_dir/episodes/rank{r}.jsonl``.

Each line is an episode record ([`multiagent_rl.episodes.records`][]: strict JSON, one schema for every
environment). The logs of different runs therefore load together as one ``datasets.Dataset`` under the fixed
features [`episode_features`][multiagent_rl.data.sinks.episode_features] (JSON itself cannot say the type of a column
that is empty or null in a whole file, e.g. ``allowed`` in a run without constrained choices, so the features are
given rather than inferred)::

    load_episode_logs(["run_a/episodes/rank0.jsonl", "run_b/episodes/rank0.jsonl"])
    # = datasets.load_dataset("json", data_files=[...], features=episode_features(), split="train")

and [`read_episodes`][multiagent_rl.data.sinks.read_episodes] turns a log back into
[`Episode`][multiagent_rl.episodes.episode.Episode] objects.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from ..episodes.episode import Episode
from ..episodes.records import episode_from_record, episode_record, record_features

logger = logging.getLogger(__name__)


class EpisodeSink(Protocol):
    """Receives the episodes of every training step."""

    def write(self, episodes: list[Episode], step: int) -> None:
        """Keep the episodes played at ``step`` (called once per step, in step order)."""

    def resume(self, step: int) -> None:
        """The run restarts at ``step``: drop everything written for steps >= ``step``."""


def read_episodes(path: str | os.PathLike) -> Iterator[tuple[int, Episode]]:
    """``(step, episode)`` for every line of an episode log."""
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            yield d["step"], episode_from_record(d)


def episode_features():
    """The ``datasets.Features`` of one episode-log line (an episode record)."""
    return record_features()


def load_episode_logs(paths: str | os.PathLike | list[str | os.PathLike]):
    """Episode logs (one or several runs) as one ``datasets.Dataset``, one row per episode."""
    import datasets

    files = [str(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)]
    return datasets.load_dataset("json", data_files=files, features=episode_features(), split="train")


class JsonlEpisodeSink:
    """One JSON line per episode in ``folder/rank{rank}.jsonl``, appended and flushed every step.

    ```pycon
    >>> sink = JsonlEpisodeSink("outputs/run/episodes", rank=0)  # doctest: +SKIP

    ```
    """

    def __init__(self, folder: str | os.PathLike, rank: int = 0):
        self.path = Path(folder) / f"rank{rank}.jsonl"

    def write(self, episodes: list[Episode], step: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = "".join(json.dumps(episode_record(ep, step), allow_nan=False) + "\n" for ep in episodes)
        with open(self.path, "a") as f:  # appended every step, so a crash loses nothing already played
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

    def resume(self, step: int) -> None:
        """Keep only the complete lines of steps before ``step`` (a killed run may have left a partial line).

        ``step`` 0 is a fresh run: an existing log is renamed aside (``rank0.<time>.jsonl``), never deleted.
        """
        if not self.path.exists():
            return
        if step == 0:
            if self.path.stat().st_size:
                aside = self.path.with_name(f"{self.path.stem}.{time.strftime('%Y%m%d-%H%M%S')}.jsonl")
                os.replace(self.path, aside)
                logger.warning("%s held episodes of an earlier run: moved to %s", self.path, aside)
            return
        kept = []
        with open(self.path) as f:
            for line in f:
                try:
                    if json.loads(line)["step"] < step:
                        kept.append(line if line.endswith("\n") else line + "\n")
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # the torn last line of a killed run
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(kept))
        os.replace(tmp, self.path)
