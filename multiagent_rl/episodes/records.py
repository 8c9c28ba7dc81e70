"""The one record format of tasks, traces and episodes: plain, strict-JSON dicts with one fixed schema for every
environment.

Everything that stores episodes writes these records: ``Episode.to_dict`` / ``Trace.to_dict``, the JSON-lines episode
log ([`multiagent_rl.data.sinks`][]) and the Parquet trace datasets, whose rows are these records flattened one per
trace ([`multiagent_rl.data.traces`][]). The free-form mappings (``task.info``, ``task.sampling``, ``episode.info``,
``trace.info``, ``trace.metrics``) are JSON-encoded strings, a non-finite float is written as ``null`` (the
episode's error says what it was), every key is always present, and the per-token streams have one key per field of
the stream table ([`STREAMS`][multiagent_rl.episodes.streams.STREAMS]). So the records of different runs and
environments load together under one set of ``datasets.Features`` ([`record_features`][multiagent_rl.episodes.records.record_features]).

```pycon
>>> from multiagent_rl.episodes import Trace, Segment
>>> t = Trace(role="solver", segments=[Segment("prompt", [1, 2]), Segment("action", [3], [-0.5])])
>>> trace_from_record(trace_record(t)).token_ids
[1, 2, 3]

```
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..tasks.task import Task, TaskData
from .episode import Episode
from .streams import stream_fields
from .trace import RewardRecord, Segment, TokenStreams, Trace


def finite(x: Any) -> Any:
    """``x`` with every non-finite float replaced by None, recursively (strict JSON has no NaN)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def number(x: Any) -> Any:
    """A finite number, or None for a non-finite one (or None)."""
    return x if x is None or math.isfinite(x) else None


def numbers(xs: list | None) -> list | None:
    """A list of numbers (None allowed) with every non-finite one replaced by None (``number`` on each, inline:
    this runs on every token of every trace)."""
    return None if xs is None else [x if x is None or math.isfinite(x) else None for x in xs]


def json_text(mapping: Any) -> str:
    """A free-form mapping as the JSON string a record holds."""
    return json.dumps(finite(mapping), allow_nan=False, sort_keys=True, default=str)


def task_record(task: Task) -> dict[str, Any]:
    data = task.data
    return {
        "prompt": data.prompt, "system_prompt": data.system_prompt,
        "answer": None if data.answer is None else str(data.answer), "id": data.id,
        "info": json_text(data.info), "sampling": json_text(task.sampling),
    }


def task_from_record(t: dict[str, Any]) -> Task:
    data = TaskData(prompt=t["prompt"], system_prompt=t["system_prompt"], answer=t["answer"],
                    info=json.loads(t["info"]), id=t["id"])
    return Task(data, json.loads(t["sampling"]))


def streams_record(streams: TokenStreams | None) -> dict[str, Any] | None:
    if streams is None:
        return None
    return {"algorithm": streams.algorithm, **{f: numbers(getattr(streams, f)) for f in stream_fields()}}


def trace_record(trace: Trace) -> dict[str, Any]:
    return {
        "role": trace.role,
        "trainable": trace.trainable,
        "model": trace.model,
        "policy": trace.policy,
        "segments": [
            {"kind": s.kind, "token_ids": s.token_ids, "logprobs": numbers(s.logprobs), "allowed": s.allowed,
             "temperature": number(s.temperature)}
            for s in trace.segments
        ],
        "messages": [{"role": str(m.get("role")), "content": str(m.get("content"))} for m in trace.messages],
        "rewards": [{"name": r.name, "value": number(r.value), "weight": number(r.weight)} for r in trace.rewards],
        "reward": number(trace.reward),
        "metrics": json_text(trace.metrics),
        "info": json_text(trace.info),
        "error": trace.error,
        "last_reply": trace.last_reply,
        "token_exact": trace.token_exact,
        "streams": streams_record(trace.streams),
    }


def trace_from_record(d: dict[str, Any]) -> Trace:
    streams = d["streams"]
    return Trace(
        role=d["role"],
        segments=[Segment(**s) for s in d["segments"]],
        trainable=d["trainable"],
        model=d["model"],
        policy=d.get("policy"),
        messages=[dict(m) for m in d["messages"]],
        rewards=[RewardRecord(r["name"], r["value"], r["weight"]) for r in d["rewards"]],
        metrics=json.loads(d["metrics"]),
        info=json.loads(d["info"]),
        error=d["error"],
        last_reply=d["last_reply"],
        streams=None if streams is None else TokenStreams.from_dict(streams),
        token_exact=d["token_exact"],
    )


def episode_record(episode: Episode, step: int | None = None, env_id: str | None = None) -> dict[str, Any]:
    """An episode's record, tagged with the training step that played it (None outside training) and the id of its
    environment (``env_id``, e.g. ``kuhn_poker``; None when the writer does not know it): ``env`` is the label of the
    config's env entry (``kuhn_poker_warmup``), which names the entry, not the game."""
    return {
        "step": step,
        "id": episode.id,
        "group": episode.group,
        "env": episode.env,
        "env_id": env_id,
        "ok": episode.ok,
        "errors": list(episode.errors),
        "info": json_text(episode.info),
        "task": task_record(episode.task),
        "traces": [trace_record(t) for t in episode.traces],
    }


def episode_from_record(d: dict[str, Any]) -> Episode:
    """The inverse of [`episode_record`][multiagent_rl.episodes.records.episode_record] (the step is ``d["step"]``,
    the env id ``d.get("env_id")``: an ``Episode`` knows only its label)."""
    return Episode(
        id=d["id"], task=task_from_record(d["task"]), group=d["group"], env=d["env"],
        traces=[trace_from_record(x) for x in d["traces"]], errors=list(d["errors"]), ok=d["ok"],
        info=json.loads(d["info"]),
    )


def feature_parts():
    from datasets import List, Value

    text, f64, i64, flag = Value("string"), Value("float64"), Value("int64"), Value("bool")
    streams = {"algorithm": text, **{f: List(f64) for f in stream_fields()}}
    task = {"prompt": text, "system_prompt": text, "answer": text, "id": text, "info": text, "sampling": text}
    return text, f64, i64, flag, streams, task


def record_features():
    """The ``datasets.Features`` of an episode record (one line of the JSON-lines episode log)."""
    from datasets import Features, List, Value

    text, f64, i64, flag, streams, task = feature_parts()
    segment = {"kind": text, "token_ids": List(i64), "logprobs": List(f64), "allowed": List(List(i64)),
               "temperature": f64}
    trace = {
        "role": text, "trainable": flag, "model": text, "policy": text, "segments": List(segment),
        "messages": List({"role": text, "content": text}),
        "rewards": List({"name": text, "value": f64, "weight": f64}),
        "reward": f64, "metrics": text, "info": text, "error": text, "last_reply": text,
        "token_exact": flag, "streams": streams,
    }
    return Features({"step": Value("int64"), "id": text, "group": text, "env": text, "env_id": text, "ok": flag,
                     "errors": List(text), "info": text, "task": task, "traces": List(trace)})
