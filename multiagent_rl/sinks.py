"""Where played episodes go: the episode log.

An [`EpisodeSink`][multiagent_rl.sinks.EpisodeSink] receives every step's episodes (``write``) and, when a run resumes
from a checkpoint at step k, forgets what it received for steps ≥ k (``resume``), so each episode is kept
exactly once. [`JsonlEpisodeSink`][multiagent_rl.sinks.JsonlEpisodeSink] writes one JSON line per episode to
``output_dir/episodes/rank{r}.jsonl``.

Each line is strict JSON (a non-finite float is written as ``null``; the episode's error says what
it was) with one schema for every environment: the free-form mappings (``task.info``,
``episode.info``, ``trace.info``, ``trace.metrics``, ``task.sampling``) are JSON-encoded strings, and
every key is always present. The logs of different runs therefore load together as one
``datasets.Dataset`` under the fixed features [`episode_features`][multiagent_rl.sinks.episode_features] (JSON itself
cannot say the type of a column that is empty or null in a whole file, e.g. ``allowed`` in a run without
constrained choices, so the features are given rather than inferred)::

    load_episode_logs(["run_a/episodes/rank0.jsonl", "run_b/episodes/rank0.jsonl"])
    # = datasets.load_dataset("json", data_files=[...], features=episode_features(), split="train")

and [`read_episodes`][multiagent_rl.sinks.read_episodes] turns a log back into
[`Episode`][multiagent_rl.episode.Episode] objects.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from .episode import Episode
from .task import Task, TaskData
from .trace import RewardRecord, Segment, TokenStreams, Trace

logger = logging.getLogger(__name__)


class EpisodeSink(Protocol):
    """Receives the episodes of every training step."""

    def write(self, episodes: list[Episode], step: int) -> None:
        """Keep the episodes played at ``step`` (called once per step, in step order)."""

    def resume(self, step: int) -> None:
        """The run restarts at ``step``: drop everything written for steps >= ``step``."""


def _finite(x: Any) -> Any:
    """``x`` with every non-finite float replaced by None, recursively (strict JSON has no NaN)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _number(x: Any) -> Any:
    """A finite number, or None for a non-finite one (or None)."""
    return x if x is None or math.isfinite(x) else None


def _numbers(xs: list | None) -> list | None:
    """A list of numbers (None allowed) with every non-finite one replaced by None.

    The records below clean only their float-bearing fields this way: walking every token id and allowed id
    through ``_finite`` cost ~0.1 s per Kuhn training step (256 traces)."""
    return None if xs is None else [x if x is None or math.isfinite(x) else None for x in xs]


def _text(mapping: Any) -> str:
    return json.dumps(_finite(mapping), allow_nan=False, sort_keys=True, default=str)


def trace_record(trace: Trace) -> dict[str, Any]:
    """A trace as a fixed-schema JSON object (see the module docstring)."""
    streams = trace.streams
    return {
        "role": trace.role,
        "trainable": trace.trainable,
        "model": trace.model,
        "segments": [
            {"kind": s.kind, "token_ids": s.token_ids, "logprobs": _numbers(s.logprobs), "allowed": s.allowed,
             "temperature": _number(s.temperature)}
            for s in trace.segments
        ],
        "messages": [{"role": str(m.get("role")), "content": str(m.get("content"))} for m in trace.messages],
        "rewards": [{"name": r.name, "value": _number(r.value), "weight": _number(r.weight)} for r in trace.rewards],
        "reward": _number(trace.reward),
        "metrics": _text(trace.metrics),
        "info": _text(trace.info),
        "error": trace.error,
        "last_reply": trace.last_reply,
        "token_exact": trace.token_exact,
        "streams": None if streams is None else {
            "algorithm": streams.algorithm, "advantages": _numbers(streams.advantages),
            "ce_weights": _numbers(streams.ce_weights), "ref_kl_weights": _numbers(streams.ref_kl_weights),
            "ref_logprobs": _numbers(streams.ref_logprobs),
        },
    }


def task_record(task: Task) -> dict[str, Any]:
    """A task as a fixed-schema JSON object (its free-form mappings JSON-encoded)."""
    data = task.data
    return {
        "prompt": data.prompt, "system_prompt": data.system_prompt,
        "answer": None if data.answer is None else str(data.answer), "id": data.id,
        "info": _text(data.info), "sampling": _text(task.sampling),
    }


def task_from_record(t: dict[str, Any]) -> Task:
    """The inverse of [`task_record`][multiagent_rl.sinks.task_record]."""
    data = TaskData(prompt=t["prompt"], system_prompt=t["system_prompt"], answer=t["answer"],
                    info=json.loads(t["info"]), id=t["id"])
    return Task(data, json.loads(t["sampling"]))


def episode_record(episode: Episode, step: int) -> dict[str, Any]:
    """An episode as a fixed-schema JSON object, tagged with the training step that played it."""
    return {
        "step": step,
        "id": episode.id,
        "group": episode.group,
        "env": episode.env,
        "ok": episode.ok,
        "errors": list(episode.errors),
        "info": _text(episode.info),
        "task": task_record(episode.task),
        "traces": [trace_record(t) for t in episode.traces],
    }


def trace_from_record(d: dict[str, Any]) -> Trace:
    """The inverse of [`trace_record`][multiagent_rl.sinks.trace_record]."""
    streams = d["streams"]
    return Trace(
        role=d["role"],
        segments=[Segment(**s) for s in d["segments"]],
        trainable=d["trainable"],
        model=d["model"],
        messages=d["messages"],
        rewards=[RewardRecord(r["name"], r["value"], r["weight"]) for r in d["rewards"]],
        metrics=json.loads(d["metrics"]),
        info=json.loads(d["info"]),
        error=d["error"],
        last_reply=d["last_reply"],
        streams=None if streams is None else TokenStreams(**streams),
        token_exact=d["token_exact"],
    )


def episode_from_record(d: dict[str, Any]) -> Episode:
    """The inverse of [`episode_record`][multiagent_rl.sinks.episode_record] (the step is ``d["step"]``)."""
    return Episode(
        id=d["id"], task=task_from_record(d["task"]), group=d["group"], env=d["env"],
        traces=[trace_from_record(x) for x in d["traces"]], errors=list(d["errors"]), ok=d["ok"],
        info=json.loads(d["info"]),
    )


def read_episodes(path: str | os.PathLike) -> Iterator[tuple[int, Episode]]:
    """``(step, episode)`` for every line of an episode log."""
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            yield d["step"], episode_from_record(d)


def episode_features():
    """The ``datasets.Features`` of one episode-log line (see the module docstring)."""
    from datasets import Features, List, Value

    text, floats, ints = Value("string"), List(Value("float64")), List(Value("int64"))
    segment = {"kind": text, "token_ids": ints, "logprobs": floats, "allowed": List(ints), "temperature": Value("float64")}
    streams = {"algorithm": text, "advantages": floats, "ce_weights": floats, "ref_kl_weights": floats,
               "ref_logprobs": floats}
    trace = {
        "role": text, "trainable": Value("bool"), "model": text, "segments": List(segment),
        "messages": List({"role": text, "content": text}),
        "rewards": List({"name": text, "value": Value("float64"), "weight": Value("float64")}),
        "reward": Value("float64"), "metrics": text, "info": text, "error": text, "last_reply": text,
        "token_exact": Value("bool"), "streams": streams,
    }
    task = {"prompt": text, "system_prompt": text, "answer": text, "id": text, "info": text, "sampling": text}
    return Features({
        "step": Value("int64"), "id": text, "group": text, "env": text, "ok": Value("bool"), "errors": List(text),
        "info": text, "task": task, "traces": List(trace),
    })


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
