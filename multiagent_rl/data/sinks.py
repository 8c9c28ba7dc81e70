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

The Parquet trace shards ([`multiagent_rl.data.traces.ParquetEpisodeSink`][]) are kept by
[`ParquetShards`][multiagent_rl.data.sinks.ParquetShards]: one file per step as it is played, merged into one shard
every ``steps_per_shard`` steps, each file written whole and then renamed into place.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..episodes.episode import Episode
from ..episodes.records import episode_from_record, episode_record, record_features

logger = logging.getLogger(__name__)


class EpisodeSink(Protocol):
    """Receives the episodes of every training step."""

    def write(self, episodes: list[Episode], step: int) -> None:
        """Keep the episodes played at ``step`` (called once per step, in step order)."""

    def resume(self, step: int) -> None:
        """The run restarts at ``step``: drop everything written for steps >= ``step``."""


def read_records(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """The episode records of an episode log, one per line. A torn last line (a run killed while writing it, and
    not resumed since) is skipped with a warning; a bad line anywhere else is an error that names the file and line."""
    with open(path) as f:
        for number, line in enumerate(f, 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                if not line.endswith("\n"):  # only the last line can lack its newline
                    logger.warning("%s: the last line is cut short (a run killed while writing it); skipped", path)
                    return
                raise ValueError(f"{path}, line {number}: not an episode record ({exc}); the log is damaged: remove "
                                 "the line, or move the file out of the folder") from None
            yield record


def read_episodes(path: str | os.PathLike) -> Iterator[tuple[int, Episode]]:
    """``(step, episode)`` for every line of an episode log."""
    for d in read_records(path):
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
    """One JSON line per episode in ``folder/rank{rank}.jsonl`` (or ``folder/filename``), appended and flushed every
    step.

    ```pycon
    >>> sink = JsonlEpisodeSink("outputs/run/episodes", rank=0)  # doctest: +SKIP

    ```
    """

    def __init__(self, folder: str | os.PathLike, rank: int = 0, env_ids: Mapping[str, str] | None = None,
                 filename: str | None = None):
        self.path = Path(folder) / (filename or f"rank{rank}.jsonl")
        self.env_ids = dict(env_ids or {})
        """Env id per env label (the records' ``env_id``; a label not in it is recorded with a null id)."""

    def write(self, episodes: list[Episode], step: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = "".join(json.dumps(episode_record(ep, step, self.env_ids.get(ep.env)), allow_nan=False) + "\n"
                       for ep in episodes)
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


# -- Parquet shard files -------------------------------------------------------------------------------------------

VERSION_KEY, STEPS_KEY, SOURCE_KEY = b"multiagent_rl.schema_version", b"multiagent_rl.steps", b"multiagent_rl.source"
"""Keys of a shard's Parquet metadata: the trace schema's version, the steps it holds (``"first-last"``), and who
wrote it (``"run/rank0"``)."""


class ShardError(ValueError):
    """A Parquet file that cannot be read as a trace shard; the message names the file, what is wrong and the fix."""


@dataclass
class ShardInfo:
    """What a shard's footer says: its Arrow schema and ``multiagent_rl`` metadata (None where absent)."""

    path: Path
    schema: Any
    version: int | None
    steps: tuple[int, int] | None
    source: str | None


def shard_info(path: str | os.PathLike) -> ShardInfo:
    """Read a shard's footer (not its rows); a file that is not Parquet, or cut short, is a ``ShardError``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError) as exc:
        raise ShardError(f"{path}: not a readable Parquet file, probably truncated (a copy cut short, a full disk; the "
                         f"sink itself writes every shard whole): {str(exc).splitlines()[0]}\nFix: move it out of "
                         "the folder (or delete it) and load again.") from None
    meta = schema.metadata or {}
    version = int(meta[VERSION_KEY]) if VERSION_KEY in meta else None
    steps = tuple(int(x) for x in meta[STEPS_KEY].split(b"-")) if STEPS_KEY in meta else None
    source = meta[SOURCE_KEY].decode() if SOURCE_KEY in meta else None
    return ShardInfo(path, schema, version, steps, source)


def live_shards(infos: list[ShardInfo]) -> list[ShardInfo]:
    """``infos`` less the files a merged shard of the same writer, in the same folder, already holds (a run killed
    between writing a merged shard and deleting its step files leaves both; each step is read once)."""
    merged = [i for i in infos if i.steps is not None and i.steps[0] < i.steps[1]]

    def covered(i: ShardInfo) -> bool:
        return i.steps is not None and any(
            m is not i and m.path.parent == i.path.parent and m.source == i.source
            and m.steps[0] <= i.steps[0] and i.steps[1] <= m.steps[1] and m.steps != i.steps for m in merged)

    return [i for i in infos if not covered(i)]


def write_parquet(table, path: Path, metadata: Mapping[bytes, bytes]) -> None:
    """Write ``table`` whole, zstd-compressed, with ``metadata`` added to its schema's: to a hidden temporary file,
    synced to disk, then renamed into place, so ``path`` is either the old file or the complete new one."""
    import pyarrow.parquet as pq

    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        pq.write_table(table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata}), f,
                       compression="zstd")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class ParquetShards:
    """One writer's Parquet files in ``folder``: ``step-{S:06d}.parquet`` for each step as it is written, merged into
    ``steps-{A:06d}-{B:06d}.parquet`` once ``steps_per_shard`` step files (or ``max_shard_bytes`` of them) wait.

    A Parquet footer costs the same for a small file as for a large one (at Kuhn poker's size, one step's file is
    ~60% footer), hence the merging; each step still lands on disk as soon as it is played, so a crash loses
    nothing, and every file is written whole and renamed into place, so a crash never leaves a torn one. A crash
    between writing a merged shard and deleting its step files leaves both: readers skip the step files a merged
    shard of the same writer holds ([`live_shards`][multiagent_rl.data.sinks.live_shards]), and the next
    ``resume`` deletes them. Every file carries ``metadata`` (the schema version, the writer) and the steps it holds.
    """

    def __init__(self, folder: str | os.PathLike, metadata: Mapping[bytes, bytes] | None = None,
                 steps_per_shard: int = 100, max_shard_bytes: int = 128 << 20):
        self.folder = Path(folder)
        self.metadata = dict(metadata or {})
        self.steps_per_shard, self.max_shard_bytes = steps_per_shard, max_shard_bytes
        self._pending: list[Path] | None = None  # step files not merged yet (read from the folder when first needed)

    def write(self, table, step: int) -> None:
        """Keep ``table`` (the rows of ``step``), then merge the waiting step files if there are enough."""
        self.folder.mkdir(parents=True, exist_ok=True)
        pending = self._scan() if self._pending is None else self._pending
        path, n = self.folder / f"step-{step:06d}.parquet", 1
        while path.exists():  # a second batch of the same step (several rollouts per optimizer step): kept beside
            path, n = self.folder / f"step-{step:06d}-{n}.parquet", n + 1
        write_parquet(table, path, {**self.metadata, STEPS_KEY: f"{step}-{step}".encode()})
        pending.append(path)
        if len(pending) >= self.steps_per_shard or sum(p.stat().st_size for p in pending) >= self.max_shard_bytes:
            self.merge()

    def merge(self) -> None:
        """Merge the waiting step files into one shard (nothing to do for fewer than two)."""
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        pending = self._scan() if self._pending is None else self._pending
        if len(pending) < 2:
            return
        table = pa.concat_tables([pq.read_table(p) for p in pending])
        bounds = pc.min_max(table["step"])
        first, last = bounds["min"].as_py(), bounds["max"].as_py()
        write_parquet(table, self.folder / f"steps-{first:06d}-{last:06d}.parquet",
                      {**self.metadata, STEPS_KEY: f"{first}-{last}".encode()})
        for p in pending:
            p.unlink()
        self._pending = []

    def close(self) -> None:
        """At the end of a run: merge the step files still waiting (the last, fewer than ``steps_per_shard``)."""
        self.merge()

    def resume(self, step: int) -> None:
        """Keep exactly the rows of steps before ``step``: files of later steps are deleted, a merged shard that
        reaches past it is rewritten (in place, then renamed) with its earlier rows only.

        ``step`` 0 is a fresh run: a folder holding an earlier run's files is moved aside (``rank0.<time>/``), never
        deleted.
        """
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        if step == 0 and any(self.folder.glob("*.parquet")):
            aside = self.folder.with_name(f"{self.folder.name}.{time.strftime('%Y%m%d-%H%M%S')}")
            os.replace(self.folder, aside)
            logger.warning("%s held traces of an earlier run: moved to %s", self.folder, aside)
        self.folder.mkdir(parents=True, exist_ok=True)
        for tmp in self.folder.glob(".*.tmp"):  # a write that was killed midway
            tmp.unlink()
        for path in sorted(self.folder.glob("*.parquet")):
            first, last = self._steps(path)
            if first >= step:
                path.unlink()
            elif last >= step:
                kept = pq.read_table(path)
                kept = kept.filter(pc.less(kept["step"], step))
                last = pc.max(kept["step"]).as_py()
                write_parquet(kept, path, {**self.metadata, STEPS_KEY: f"{first}-{last}".encode()})
                path.rename(self.folder / f"steps-{first:06d}-{last:06d}.parquet")
        self._pending = None
        self._scan()

    def _steps(self, path: Path) -> tuple[int, int]:
        steps = shard_info(path).steps
        if steps is None:  # a shard written before shards carried their steps: one step each, named after it
            import pyarrow.compute as pc
            import pyarrow.parquet as pq

            bounds = pc.min_max(pq.read_table(path, columns=["step"])["step"])
            steps = (bounds["min"].as_py(), bounds["max"].as_py())
        return steps

    def _scan(self) -> list[Path]:
        """The step files waiting to be merged; those a merged shard already holds (the leftovers of a crash in the
        middle of a merge) are deleted."""
        merged = [self._steps(p) for p in self.folder.glob("steps-*.parquet")]
        self._pending = []
        for path in sorted(self.folder.glob("step-*.parquet")):
            step = self._steps(path)[0]
            if any(a <= step <= b for a, b in merged):
                path.unlink()
            else:
                self._pending.append(path)
        return self._pending
