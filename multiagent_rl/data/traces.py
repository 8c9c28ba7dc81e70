"""Traces as a Hugging Face ``datasets.Dataset``: one row per trace, one schema for every run.

The schema ([`trace_features`][multiagent_rl.data.traces.trace_features]) is fixed, so the traces of different runs
and environments load and concatenate together. Free-form mappings (metrics, info) are JSON-encoded strings; everything
per token is a flat list aligned with ``token_ids``:

| column | meaning |
|---|---|
| run | the run's name (``output_dir``'s folder name unless given) |
| step | the optimizer steps taken before the episode was played (0 for the first; the console's ``step k`` line trains on the episodes of ``step`` k − 1) |
| episode, group | the episode's id and its task group's id; ``trace_index``: the trace's place in it |
| env, env_id | the label of the config's env entry (``kuhn_poker_warmup``) and the environment's id (``kuhn_poker``; null where the writer was not told it) |
| role, model | the seat, the model that played it (``policy`` = a trained one, ``pool:NAME``, ``scripted``, a teacher's id) |
| policy | which policy played it: the learner's name, or a pool snapshot's (``policy@200``); null for frozen and scripted seats |
| trainable | whether the trace was trained on; ``algorithm``: the algorithm that scored it (or null) |
| episode_ok | False for a failed episode (its ``episode_errors`` say why; never trained on) |
| task | the task: prompt, system_prompt, answer, id, info (JSON), sampling (JSON) |
| messages | the conversation as the seat saw it (``role``, ``content``) |
| token_ids | every token of the trace, in order |
| token_kinds | per token: ``prompt``, ``action`` or ``observation`` |
| logprobs | per token: the sampling log-probability (null where not sampled) |
| allowed | per token: the ids a constrained choice allowed (null: unconstrained) |
| segments | per segment: kind, length, temperature, has_logprobs, has_allowed (for the exact round trip) |
| rewards, reward | the named reward records (name, value, weight) and their weighted sum |
| advantage_mean | mean advantage over the action tokens (null when the trace was not scored); ``_min``, ``_max`` |
| streams | the per-token loss streams (advantages, ce_weights, ref_kl_weights, ref_logprobs) |
| metrics, info | JSON-encoded mappings; ``error``, ``last_reply``, ``token_exact`` as on the trace |

[`episodes_to_dataset`][multiagent_rl.data.traces.episodes_to_dataset] and
[`dataset_to_episodes`][multiagent_rl.data.traces.dataset_to_episodes] are exact inverses (a test checks it).
[`ParquetEpisodeSink`][multiagent_rl.data.traces.ParquetEpisodeSink] writes each step's traces as a zstd-compressed
Parquet file, ``output_dir/traces/rank{r}/step-{step:06d}.parquet``, and merges every 100 of them into one shard,
``steps-{first:06d}-{last:06d}.parquet`` ([`ParquetShards`][multiagent_rl.data.sinks.ParquetShards]), and the
record of each episode that failed before any seat finished (it has no trace, so no row) to
``output_dir/traces/failed-rank{r}.jsonl``; every file
carries the schema version ([`SCHEMA_VERSION`][multiagent_rl.data.traces.SCHEMA_VERSION]) in its Parquet metadata.
[`load_traces`][multiagent_rl.data.traces.load_traces] reads any number of runs, a flat folder of shards or one
shard file, and names the file and the columns when one is not a trace shard of this version.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from ..episodes.episode import Episode
from ..episodes.records import episode_from_record, episode_record, number, task_from_record, trace_from_record
from ..episodes.trace import Trace
from .sinks import (SOURCE_KEY, VERSION_KEY, JsonlEpisodeSink, ParquetShards, ShardError, ShardInfo, live_shards,
                    read_records, shard_info)

SCHEMA_VERSION = 3
"""The trace schema's version, stored in every shard's Parquet metadata and checked on load. 2 added ``env_id``, 3
``policy``; older shards (version 1: written before shards carried a version) still load, those columns null."""
ADDED_IN = {"env_id": 2, "policy": 3}
"""The columns added after version 1, with the version that added each."""
logger = logging.getLogger(__name__)
_RANK_FOLDER = re.compile(r"rank\d+")  # a sink's folder; rank0.<time>/ is an earlier run's, moved aside


def trace_features():
    """The ``datasets.Features`` of a trace dataset (see the module docstring)."""
    from datasets import Features, List

    from ..episodes.records import feature_parts

    text, f64, i64, flag, streams, task = feature_parts()
    return Features({
        "run": text, "step": i64, "episode": text, "group": text, "trace_index": i64, "env": text, "env_id": text,
        "episode_ok": flag, "episode_errors": List(text), "episode_info": text, "task": task,
        "role": text, "model": text, "policy": text, "trainable": flag, "algorithm": text,
        "messages": List({"role": text, "content": text}),
        "token_ids": List(i64), "token_kinds": List(text), "logprobs": List(f64), "allowed": List(List(i64)),
        "segments": List({"kind": text, "length": i64, "temperature": f64, "has_logprobs": flag,
                          "has_allowed": flag}),
        "rewards": List({"name": text, "value": f64, "weight": f64}), "reward": f64,
        "advantage_mean": f64, "advantage_min": f64, "advantage_max": f64, "streams": streams,
        "metrics": text, "info": text, "error": text, "last_reply": text, "token_exact": flag,
    })


# A row is the episode's record with its trace's record flattened into it (segments as flat per-token lists).
_TRACE_FIELDS = ("role", "model", "policy", "trainable", "messages", "rewards", "reward", "streams", "metrics", "info", "error",
                 "last_reply", "token_exact")


def trace_rows(episode: Episode, step: int, run: str = "", env_id: str | None = None) -> list[dict[str, Any]]:
    """The rows of one episode, one per trace: its record ([`episode_record`][multiagent_rl.episodes.records.episode_record])
    flattened."""
    episode_rec = episode_record(episode, step, env_id)
    rows = []
    for index, (trace, record) in enumerate(zip(episode.traces, episode_rec["traces"])):
        streams = trace.streams
        advantages = record["streams"]["advantages"] if streams is not None else None
        action_adv = [a for a, k in zip(advantages or [], trace.token_kinds) if k == "action"]
        if None in action_adv:  # a non-finite advantage: no summary rather than one of the finite rest
            action_adv = []
        rows.append({
            "run": run, "step": step, "episode": episode.id, "group": episode.group, "trace_index": index,
            "env": episode.env, "env_id": env_id, "episode_ok": episode.ok, "episode_errors": episode_rec["errors"],
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


def episodes_to_dataset(episodes: Iterable[tuple[int, Episode]], run: str = "", env_ids: dict[str, str] | None = None):
    """``(step, episode)`` pairs as a trace dataset (an episode without traces contributes no row); ``env_ids`` maps
    env labels to env ids ([`env_ids`][multiagent_rl.data.traces.env_ids])."""
    import datasets

    rows = [row for step, ep in episodes for row in trace_rows(ep, step, run, (env_ids or {}).get(ep.env))]
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
    """Each step's traces as a zstd-compressed Parquet file in ``folder/rank{rank}/``, merged into one shard every
    ``steps_per_shard`` steps (or ``max_shard_bytes``): [`ParquetShards`][multiagent_rl.data.sinks.ParquetShards].

    Every file is written whole (to a temporary name, then renamed), so a crash never leaves a torn one; resuming at
    step k drops exactly the rows of steps >= k, so each episode is kept once. A fresh run (step 0) in a folder that
    holds an earlier run's shards moves them aside (``rank0.<time>/``), never deletes them. ``env_ids`` (env label →
    env id, [`env_ids`][multiagent_rl.data.traces.env_ids]) fills the rows' ``env_id``.
    """

    def __init__(self, folder: str | os.PathLike, rank: int = 0, run: str = "", env_ids: dict[str, str] | None = None,
                 steps_per_shard: int = 100, max_shard_bytes: int = 128 << 20):
        self.folder = Path(folder) / f"rank{rank}"
        self.run, self.env_ids = run, dict(env_ids or {})
        metadata = {VERSION_KEY: str(SCHEMA_VERSION).encode(), SOURCE_KEY: f"{run}/rank{rank}".encode()}
        self.shards = ParquetShards(self.folder, metadata, steps_per_shard, max_shard_bytes)
        self.folder.mkdir(parents=True, exist_ok=True)
        # A row is a trace: an episode that failed before any seat finished has none, so its record (errors and
        # traceback) goes to a JSON-lines file beside the shards instead of being lost.
        self.failed = JsonlEpisodeSink(Path(folder), rank, self.env_ids, filename=f"failed-rank{rank}.jsonl")

    def write(self, episodes: list[Episode], step: int) -> None:
        """Keep the traces of ``step``'s episodes, and the records of its episodes without any trace in
        ``failed-rank{rank}.jsonl``."""
        import pyarrow as pa

        rows = [row for ep in episodes for row in trace_rows(ep, step, self.run, self.env_ids.get(ep.env))]
        if rows:
            self.shards.write(pa.Table.from_pylist(rows, schema=trace_features().arrow_schema), step)
        traceless = [ep for ep in episodes if not ep.traces]
        if traceless:
            self.failed.write(traceless, step)

    def resume(self, step: int) -> None:
        """The run restarts at ``step``: keep exactly the rows of earlier steps (0: a fresh run, see above)."""
        self.shards.resume(step)
        self.failed.resume(step)

    def close(self) -> None:
        """Merge the last steps' files into one shard (a run that ends without it leaves them as they are)."""
        self.shards.close()


def env_ids(experiment) -> dict[str, str]:
    """Env id per env label of an experiment (``{"kuhn_poker_warmup": "kuhn_poker", ...}``): what the sinks record
    as ``env_id``, so traces can be filtered by the env's id as well as by the entry's label."""
    from ..config import env_labels

    return {label: spec.id for label, spec in zip(env_labels(experiment), experiment.env)}


def _files(root: Path) -> tuple[list[Path], list[Path]]:
    """The trace shards and the episode logs ``root`` names: itself (a file), the shards directly in it (a flat
    folder) or in ``rank{r}/`` folders below it (runs), else the ``rank{r}.jsonl`` logs below it."""
    if root.is_file():
        if root.suffix not in (".parquet", ".jsonl"):
            raise ValueError(f"{root}: neither a trace shard (.parquet) nor an episode log (.jsonl)")
        return ([root], []) if root.suffix == ".parquet" else ([], [root])
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such file or folder")
    shards = {p for p in root.glob("*.parquet")} | {p for p in root.rglob("*.parquet")
                                                    if _RANK_FOLDER.fullmatch(p.parent.name)}
    logs = [p for p in root.rglob("rank*.jsonl") if re.fullmatch(r"rank\d+\.jsonl", p.name)]
    if not shards and not logs:
        raise FileNotFoundError(f"no trace shards (*.parquet, in {root} itself or in rank*/ folders below it) or "
                                f"episode logs (rank*.jsonl) under {root}: give a run's traces/ or episodes/ folder, "
                                "a folder of shards, or one file")
    return sorted(p for p in shards if not p.name.startswith(".")), sorted(logs)


def _schema_diff(found, expected) -> str:
    """What differs between two Arrow schemas, in one line ("" if nothing)."""
    missing = [n for n in expected.names if n not in found.names]
    extra = [n for n in found.names if n not in expected.names]
    retyped = [f"{n} ({str(expected.field(n).type)[:60]} expected, {str(found.field(n).type)[:60]} found)"
               for n in expected.names if n in found.names and found.field(n).type != expected.field(n).type]
    parts = [("missing: ", missing), ("unexpected: ", extra), ("of another type: ", retyped)]
    return "; ".join(label + ", ".join(names) for label, names in parts if names)


def _shard_version(info: ShardInfo) -> int:
    """Check a shard against the schema of its version (``SCHEMA_VERSION`` or an older one) and return that version;
    anything else is a ``ShardError`` naming the file and what differs."""
    if info.version is not None and not 2 <= info.version <= SCHEMA_VERSION:
        raise ShardError(f"{info.path}: written with trace schema version {info.version}; this multiagent_rl reads "
                         f"version {SCHEMA_VERSION} (and versions 1 to {SCHEMA_VERSION - 1}).\nFix: load it with the "
                         "multiagent_rl release that wrote it, or move it out of the folder.")
    if info.version is None and not _schema_diff(info.schema, trace_features().arrow_schema):
        return SCHEMA_VERSION
    version = info.version or 1
    diff = _schema_diff(info.schema, _features_of(version).arrow_schema)
    if not diff:
        return version
    raise ShardError(f"{info.path}: not a trace shard of schema version {version}: {diff}.\nFix: move it out "
                     "of the folder; another dataset in Parquet loads with datasets.load_dataset('parquet', ...).")


def _features_of(version: int):
    """The features of a shard of schema ``version`` (the current ones without the columns added later)."""
    features = trace_features()
    for column, added in ADDED_IN.items():
        if version < added:
            del features[column]
    return features


def _load_parquet(files: list[Path], features):
    """``datasets``' Parquet loader, with the file that fails named (its own error names it only in a log line)."""
    import datasets
    import pyarrow.parquet as pq

    try:
        return datasets.load_dataset("parquet", data_files=[str(f) for f in files], features=features, split="train")
    except datasets.exceptions.DatasetGenerationError as exc:
        for f in files:
            try:
                pq.read_table(f)
            except Exception as bad:  # noqa: BLE001 - any reader error: the file is what the user needs to know
                raise ShardError(f"{f}: unreadable ({str(bad).splitlines()[0]}).\nFix: move it out of the folder "
                                 "(or delete it) and load again.") from exc
        raise


def load_traces(folders: str | os.PathLike | list[str | os.PathLike]):
    """The traces of one or several runs as one dataset: a run's ``traces/`` (or any parent of runs), a flat folder
    of shards, a single shard file. A folder with only JSON-lines episode logs (``episode_format = "jsonl"``,
    ``rank*.jsonl``), or one such log, is converted on the way. A file that is not a trace shard of this schema
    version is an error that names it and what differs; shards of older versions load with the newer columns null
    (``ADDED_IN``)."""
    import datasets

    parts = []
    for root in [Path(f) for f in ([folders] if isinstance(folders, (str, os.PathLike)) else folders)]:
        shards, logs = _files(root)
        if shards:
            by_version = defaultdict(list)
            for info in live_shards([shard_info(f) for f in shards]):
                by_version[_shard_version(info)].append(info.path)
            for version, paths in sorted(by_version.items(), reverse=True):
                part = _load_parquet(sorted(paths), _features_of(version))
                for column, added in ADDED_IN.items():
                    if version < added:
                        part = part.add_column(column, [None] * len(part))
                parts.append(part.cast(trace_features()) if version < SCHEMA_VERSION else part)
            continue
        base = root.parent if root.is_file() else root
        run = (base.parent if base.name in ("episodes", "traces") else base).name
        rows = [row for log in logs for d in read_records(log)
                for row in trace_rows(episode_from_record(d), d["step"], run, d.get("env_id"))]
        parts.append(datasets.Dataset.from_list(rows, features=trace_features()))
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def filter_traces(dataset, *, env: str | list[str] | None = None, role: str | list[str] | None = None,
                  model: str | list[str] | None = None, min_reward: float | None = None,
                  steps: tuple[int, int] | None = None, ok_only: bool = True):
    """The rows of ``dataset`` that match every given filter: ``env`` an env label or id, ``role`` a seat,
    ``model`` who played it (``"policy"``: the trained model), ``steps`` an inclusive range. Matching nothing is
    warned about, with the envs, roles and models the dataset has."""
    def wanted(x):
        return {x} if isinstance(x, str) else set(x or ())

    envs, roles, models = wanted(env), wanted(role), wanted(model)
    columns = ["env", "role", "model", "reward", "step", "episode_ok"]
    has_id = "env_id" in dataset.column_names  # datasets pushed before the schema had it have none

    def keep(envs_, roles_, models_, rewards, steps_, oks, ids=None):
        ids = ids or [None] * len(envs_)
        return [(not envs or e in envs or i in envs) and (not roles or r in roles) and (not models or m in models)
                and (min_reward is None or (w is not None and w >= min_reward))
                and (steps is None or steps[0] <= s <= steps[1]) and (not ok_only or ok)
                for e, r, m, w, s, ok, i in zip(envs_, roles_, models_, rewards, steps_, oks, ids)]

    kept = dataset.filter(keep, input_columns=columns + (["env_id"] if has_id else []), batched=True)
    if len(kept) == 0 and len(dataset):
        ids = sorted({i for i in dataset["env_id"] if i}) if has_id else []
        logger.warning("no trace matches env=%s role=%s model=%s min_reward=%s steps=%s%s: the dataset has envs %s%s, "
                       "roles %s, models %s, steps %d to %d", env, role, model, min_reward, steps,
                       " (ok episodes only)" if ok_only else "", sorted(set(dataset["env"])),
                       f" (ids {ids})" if ids else "", sorted(set(dataset["role"])), sorted(set(dataset["model"])),
                       min(dataset["step"]), max(dataset["step"]))
    return kept


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


def schema_table() -> str:
    """The schema table of this module's docstring as plain Markdown (code in single backticks, no cross-reference
    brackets): for pages that are not the API reference, like a dataset card on the Hub."""
    table = "\n".join(line for line in __doc__.splitlines() if line.startswith("|"))
    return re.sub(r"\[([^\]]+)\]\[[\w.]*\]", r"\1", table).replace("``", "`")


def episode_sink(output_dir: str | None, episode_format: str, rank: int, experiment=None):
    """Where a run's played episodes go: Parquet trace shards in ``output_dir/traces/`` (``"parquet"``) or JSON lines
    in ``output_dir/episodes/`` (``"jsonl"``); None without an output folder. With the ``experiment``, the records
    carry each episode's env id beside its label."""
    if not output_dir:
        return None
    ids = env_ids(experiment) if experiment is not None else None
    if episode_format == "jsonl":
        return JsonlEpisodeSink(os.path.join(output_dir, "episodes"), rank, env_ids=ids)
    return ParquetEpisodeSink(os.path.join(output_dir, "traces"), rank,
                              run=os.path.basename(os.path.normpath(output_dir)), env_ids=ids)
