"""Traces as a Hugging Face ``datasets.Dataset``: one row per trace, one schema for every run.

The schema ([`trace_features`][multiagent_rl.data.traces.trace_features]) is fixed, so the traces of different runs
and environments load and concatenate together. Free-form mappings (metrics, info) are JSON-encoded strings; everything
per token is a flat list aligned with ``token_ids``:

================  =====================================================================================
column            meaning
================  =====================================================================================
run               the run's name (``output_dir``'s folder name unless given)
step              the training step that played the episode
episode, group    the episode's id and its task group's id; ``trace_index``: the trace's place in it
env, role, model  the environment's label, the seat, the model that played it (``policy`` = trained one)
trainable         whether the trace was trained on; ``algorithm``: the algorithm that scored it (or null)
episode_ok        False for a failed episode (its ``episode_errors`` say why; never trained on)
task              the task: prompt, system_prompt, answer, id, info (JSON), sampling (JSON)
messages          the conversation as the seat saw it (``role``, ``content``)
token_ids         every token of the trace, in order
token_kinds       per token: ``prompt``, ``action`` or ``observation``
logprobs          per token: the sampling log-probability (null where not sampled)
allowed           per token: the ids a constrained choice allowed (null: unconstrained)
segments          per segment: kind, length, temperature, has_logprobs, has_allowed (for the exact round trip)
rewards, reward   the named reward records (name, value, weight) and their weighted sum
advantage_mean    mean advantage over the action tokens (null when the trace was not scored); ``_min``, ``_max``
streams           the per-token loss streams (advantages, ce_weights, ref_kl_weights, ref_logprobs)
metrics, info     JSON-encoded mappings; ``error``, ``last_reply``, ``token_exact`` as on the trace
================  =====================================================================================

[`episodes_to_dataset`][multiagent_rl.data.traces.episodes_to_dataset] and
[`dataset_to_episodes`][multiagent_rl.data.traces.dataset_to_episodes] are exact inverses (a test checks it).
[`ParquetEpisodeSink`][multiagent_rl.data.traces.ParquetEpisodeSink] writes one zstd-compressed Parquet shard per step
and rank (``output_dir/traces/rank{r}/step-{step:06d}.parquet``);
[`load_traces`][multiagent_rl.data.traces.load_traces] reads any number of runs.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from ..episodes.episode import Episode
from ..episodes.records import episode_record, number, task_from_record, trace_from_record
from ..episodes.trace import Trace

SCHEMA_VERSION = 1
logger = logging.getLogger(__name__)


def trace_features():
    """The ``datasets.Features`` of a trace dataset (see the module docstring)."""
    from datasets import Features, List

    from ..episodes.records import feature_parts

    text, f64, i64, flag, streams, task = feature_parts()
    return Features({
        "run": text, "step": i64, "episode": text, "group": text, "trace_index": i64, "env": text,
        "episode_ok": flag, "episode_errors": List(text), "episode_info": text, "task": task,
        "role": text, "model": text, "trainable": flag, "algorithm": text,
        "messages": List({"role": text, "content": text}),
        "token_ids": List(i64), "token_kinds": List(text), "logprobs": List(f64), "allowed": List(List(i64)),
        "segments": List({"kind": text, "length": i64, "temperature": f64, "has_logprobs": flag,
                          "has_allowed": flag}),
        "rewards": List({"name": text, "value": f64, "weight": f64}), "reward": f64,
        "advantage_mean": f64, "advantage_min": f64, "advantage_max": f64, "streams": streams,
        "metrics": text, "info": text, "error": text, "last_reply": text, "token_exact": flag,
    })


# A row is the episode's record with its trace's record flattened into it (segments as flat per-token lists).
_TRACE_FIELDS = ("role", "model", "trainable", "messages", "rewards", "reward", "streams", "metrics", "info", "error",
                 "last_reply", "token_exact")


def trace_rows(episode: Episode, step: int, run: str = "") -> list[dict[str, Any]]:
    """The rows of one episode, one per trace: its record ([`episode_record`][multiagent_rl.episodes.records.episode_record])
    flattened."""
    episode_rec = episode_record(episode, step)
    rows = []
    for index, (trace, record) in enumerate(zip(episode.traces, episode_rec["traces"])):
        streams = trace.streams
        advantages = record["streams"]["advantages"] if streams is not None else None
        action_adv = [a for a, k in zip(advantages or [], trace.token_kinds) if k == "action"]
        if None in action_adv:  # a non-finite advantage: no summary rather than one of the finite rest
            action_adv = []
        rows.append({
            "run": run, "step": step, "episode": episode.id, "group": episode.group, "trace_index": index,
            "env": episode.env, "episode_ok": episode.ok, "episode_errors": episode_rec["errors"],
            "episode_info": episode_rec["info"], "task": episode_rec["task"],
            **{key: record[key] for key in _TRACE_FIELDS},
            "algorithm": streams.algorithm if streams is not None else None,
            "token_ids": trace.token_ids, "token_kinds": trace.token_kinds,
            "logprobs": [lp for s in record["segments"] for lp in (s["logprobs"] or [None] * len(s["token_ids"]))],
            "allowed": [a for s in trace.segments for a in (s.allowed or [None] * len(s.token_ids))],
            "segments": [{"kind": s.kind, "length": len(s.token_ids), "temperature": number(s.temperature),
                          "has_logprobs": s.logprobs is not None, "has_allowed": s.allowed is not None}
                         for s in trace.segments],
            "advantage_mean": sum(action_adv) / len(action_adv) if action_adv else None,
            "advantage_min": min(action_adv) if action_adv else None,
            "advantage_max": max(action_adv) if action_adv else None,
        })
    return rows


def episodes_to_dataset(episodes: Iterable[tuple[int, Episode]], run: str = ""):
    """``(step, episode)`` pairs as a trace dataset (an episode without traces contributes no row)."""
    import datasets

    rows = [row for step, ep in episodes for row in trace_rows(ep, step, run)]
    return datasets.Dataset.from_list(rows, features=trace_features())


def _trace(row: dict[str, Any]) -> Trace:
    """A row back to its trace: the segments re-nested, then decoded as the episode log's record."""
    segments, start = [], 0
    for seg in row["segments"]:
        end = start + seg["length"]
        segments.append({"kind": seg["kind"], "token_ids": row["token_ids"][start:end],
                         "logprobs": row["logprobs"][start:end] if seg["has_logprobs"] else None,
                         "allowed": row["allowed"][start:end] if seg["has_allowed"] else None,
                         "temperature": seg["temperature"]})
        start = end
    streams = row["streams"]
    if streams is not None and all(v is None for v in streams.values()):
        streams = None  # Arrow gives a null struct back as a struct of nulls
    record = {**{key: row[key] for key in _TRACE_FIELDS}, "segments": segments, "streams": streams,
              "messages": [dict(m) for m in row["messages"]]}
    return trace_from_record(record)


def dataset_to_episodes(dataset) -> list[tuple[int, Episode]]:
    """The inverse of [`episodes_to_dataset`][multiagent_rl.data.traces.episodes_to_dataset]: ``(step, episode)``
    pairs, in the order of first appearance."""
    by_episode: dict[tuple[str, int, str], list[dict]] = defaultdict(list)
    for row in dataset:
        by_episode[(row["run"], row["step"], row["episode"])].append(row)
    out = []
    for (_, step, _), rows in by_episode.items():
        rows.sort(key=lambda r: r["trace_index"])
        first = rows[0]
        out.append((step, Episode(
            id=first["episode"], task=task_from_record(first["task"]), group=first["group"], env=first["env"],
            traces=[_trace(r) for r in rows], errors=list(first["episode_errors"]), ok=first["episode_ok"],
            info=json.loads(first["episode_info"]))))
    return out


class ParquetEpisodeSink:
    """Each step's traces as one zstd-compressed Parquet shard, ``folder/rank{rank}/step-{step:06d}.parquet``.

    A shard is written whole (to a temporary name, then renamed), so a crash never leaves a torn one; resuming
    at step k deletes the shards of steps >= k, so each episode is kept exactly once. A fresh run (step 0) in a
    folder that holds an earlier run's shards moves them aside (``rank0.<time>/``), never deletes them.
    """

    def __init__(self, folder: str | os.PathLike, rank: int = 0, run: str = ""):
        self.folder = Path(folder) / f"rank{rank}"
        self.run = run
        self.folder.mkdir(parents=True, exist_ok=True)

    def write(self, episodes: list[Episode], step: int) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = [row for ep in episodes for row in trace_rows(ep, step, self.run)]
        if not rows:
            return
        table = pa.Table.from_pylist(rows, schema=trace_features().arrow_schema)
        path = self.folder / f"step-{step:06d}.parquet"
        tmp = path.with_suffix(".tmp")
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, path)

    def resume(self, step: int) -> None:
        if step == 0 and any(self.folder.glob("step-*.parquet")):
            aside = self.folder.with_name(f"{self.folder.name}.{time.strftime('%Y%m%d-%H%M%S')}")
            os.replace(self.folder, aside)
            logger.warning("%s held traces of an earlier run: moved to %s", self.folder, aside)
            self.folder.mkdir(parents=True, exist_ok=True)
            return
        for shard in self.folder.glob("step-*.parquet"):
            if int(shard.stem.split("-")[1]) >= step:
                shard.unlink()


def load_traces(folders: str | os.PathLike | list[str | os.PathLike]):
    """The trace shards under one or several folders (a run's ``traces/``, or any parent) as one dataset. A folder
    with only JSON-lines episode logs (``episode_format = "jsonl"``, ``rank*.jsonl``) is converted on the way."""
    import datasets

    from .sinks import read_episodes

    roots = [Path(f) for f in ([folders] if isinstance(folders, (str, os.PathLike)) else folders)]
    parts = []
    for root in roots:
        # rank{r}/ folders only: an earlier run's shards moved aside (rank0.<time>/) are not this run's
        shards = sorted(str(p) for p in root.rglob("step-*.parquet") if re.fullmatch(r"rank\d+", p.parent.name))
        if shards:
            parts.append(datasets.load_dataset("parquet", data_files=shards, features=trace_features(), split="train"))
            continue
        logs = sorted(p for p in root.rglob("rank*.jsonl") if re.fullmatch(r"rank\d+\.jsonl", p.name))
        if not logs:
            raise FileNotFoundError(f"no trace shards (step-*.parquet) or episode logs (rank*.jsonl) under {root}")
        run = (root.parent if root.name in ("episodes", "traces") else root).name
        parts.append(episodes_to_dataset([pair for log in logs for pair in read_episodes(log)], run=run))
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def filter_traces(dataset, *, env: str | list[str] | None = None, role: str | list[str] | None = None,
                  min_reward: float | None = None, steps: tuple[int, int] | None = None, ok_only: bool = True):
    """The rows of ``dataset`` that match every given filter (``steps`` is an inclusive range)."""
    envs = {env} if isinstance(env, str) else set(env or ())
    roles = {role} if isinstance(role, str) else set(role or ())

    def keep(row) -> bool:
        return ((not envs or row["env"] in envs) and (not roles or row["role"] in roles)
                and (min_reward is None or (row["reward"] is not None and row["reward"] >= min_reward))
                and (steps is None or steps[0] <= row["step"] <= steps[1]) and (not ok_only or row["episode_ok"]))

    return dataset.filter(keep)


def to_sft_prompt_completion(dataset):
    """One row per assistant reply: ``{"prompt": [the conversation before it], "completion": [the reply]}``, TRL's
    conversational prompt–completion format (``SFTTrainer`` then computes the loss on the replies only)."""
    def convert(batch):
        prompts, completions = [], []
        for messages in batch["messages"]:
            for i, m in enumerate(messages):
                if m["role"] == "assistant" and i > 0:
                    prompts.append(messages[:i])
                    completions.append([m])
        return {"prompt": prompts, "completion": completions}

    return dataset.map(convert, batched=True, remove_columns=dataset.column_names)


def to_sft_messages(dataset, include_system: bool = True):
    """Rows as ``{"messages": [...]}``, the conversational format TRL's ``SFTTrainer`` takes (the trace's own
    conversation, ending with its last reply)."""
    def convert(row):
        messages = [m for m in row["messages"] if include_system or m["role"] != "system"]
        return {"messages": messages}

    return dataset.map(convert, remove_columns=dataset.column_names)


def episode_sink(output_dir: str | None, episode_format: str, rank: int):
    """Where a run's played episodes go: Parquet trace shards in ``output_dir/traces/`` (``"parquet"``) or JSON lines
    in ``output_dir/episodes/`` (``"jsonl"``); None without an output folder."""
    if not output_dir:
        return None
    if episode_format == "jsonl":
        from .sinks import JsonlEpisodeSink

        return JsonlEpisodeSink(os.path.join(output_dir, "episodes"), rank)
    return ParquetEpisodeSink(os.path.join(output_dir, "traces"), rank,
                              run=os.path.basename(os.path.normpath(output_dir)))
