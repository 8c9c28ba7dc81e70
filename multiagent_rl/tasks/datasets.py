"""Tasks from Hugging Face datasets: a ``datasets.Dataset``, a local data file or folder, or a Hub id, with a column
mapping, for any environment.

```toml
[[env]]
id = "my_envs:QA"
[env.tasks]
dataset = "data/questions.jsonl"     # a Hub id, a local file (.json/.jsonl/.csv/.parquet) or a saved dataset folder
split = "train"
prompt = "question"                  # the column each TaskData field comes from
answer = "answer"
```

Every other column goes into ``TaskData.info`` (or only the ones listed in ``info``). Episodes draw tasks uniformly at
random with the rollout engine's random stream, which checkpoints save, so a resumed run draws the same tasks.

```pycon
>>> import datasets, random
>>> rows = datasets.Dataset.from_dict({"question": ["1+1?", "2+2?"], "answer": ["2", "4"]})
>>> tasks = DatasetTasks.from_dataset(rows, DatasetTasksConfig(prompt="question", answer="answer"))
>>> [t.data.answer for t in tasks.sample(3, random.Random(0))]
['4', '4', '2']

```
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .task import Task, TaskData

_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}


class DatasetTasksConfig(BaseModel):
    """Where an environment's tasks come from (``[env.tasks]``) and which column holds each field."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, arbitrary_types_allowed=True)

    dataset: Any = None
    """A Hub dataset id, a local data file (``.json``, ``.jsonl``, ``.csv``, ``.parquet``), a folder written by
    ``Dataset.save_to_disk``, or (Python only) a ``datasets.Dataset``."""
    split: str = "train"
    subset: str | None = None
    """The dataset's configuration name, if it has several (``load_dataset(id, subset)``)."""
    prompt: str = "prompt"
    """The column holding the prompt."""
    answer: str | None = None
    system_prompt: str | None = None
    id: str | None = None
    """The column holding each task's id (kept in traces)."""
    info: list[str] | None = None
    """Columns copied into ``TaskData.info`` (None: every column not mapped above)."""
    limit: int | None = Field(None, ge=1)
    """Use only the first ``limit`` rows."""


class DatasetTasks:
    """A task set drawn from a dataset's rows."""

    def __init__(self, tasks: list[TaskData]):
        if not tasks:
            raise ValueError("the dataset gave no tasks (an empty split?)")
        self.tasks = tasks

    @classmethod
    def from_config(cls, config: DatasetTasksConfig) -> DatasetTasks:
        return cls.from_dataset(load_rows(config), config)

    @classmethod
    def from_dataset(cls, rows, config: DatasetTasksConfig) -> DatasetTasks:
        columns = list(rows.column_names)
        mapped = [c for c in (config.prompt, config.answer, config.system_prompt, config.id) if c is not None]
        missing = [c for c in [*mapped, *(config.info or [])] if c not in columns]
        if missing:
            raise ValueError(f"[env.tasks]: the dataset has no column {missing}; its columns are {columns}")
        info = config.info if config.info is not None else [c for c in columns if c not in mapped]
        if config.limit is not None:
            rows = rows.select(range(min(config.limit, len(rows))))
        tasks = [
            TaskData(prompt=str(row[config.prompt]),
                     answer=None if config.answer is None or row[config.answer] is None else str(row[config.answer]),
                     system_prompt=None if config.system_prompt is None else row[config.system_prompt],
                     id=None if config.id is None else str(row[config.id]),
                     info={c: row[c] for c in info})
            for row in rows
        ]
        return cls(tasks)

    def sample(self, num: int, rng: random.Random) -> list[Task]:
        """``num`` tasks drawn uniformly with replacement from ``rng``."""
        return [Task(rng.choice(self.tasks)) for _ in range(num)]


def load_rows(config: DatasetTasksConfig):
    """The configured split as a ``datasets.Dataset`` (offline when ``HF_HUB_OFFLINE`` is set: a Hub id then has to
    be in the local cache)."""
    import datasets

    source = config.dataset
    if isinstance(source, datasets.Dataset):
        return source
    if isinstance(source, datasets.DatasetDict):
        return source[config.split]
    if not isinstance(source, (str, os.PathLike)) or not str(source):
        raise ValueError("[env.tasks] needs `dataset`: a Hub id, a local data file or folder, or a datasets.Dataset")
    path = Path(source)
    if path.is_dir() and ((path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()):
        loaded = datasets.load_from_disk(str(path))
        return loaded[config.split] if isinstance(loaded, datasets.DatasetDict) else loaded
    if path.is_file():
        builder = _FILE_BUILDERS.get(path.suffix)
        if builder is None:
            raise ValueError(f"[env.tasks] dataset = {str(source)!r}: a data file ends in one of {sorted(_FILE_BUILDERS)}")
        return datasets.load_dataset(builder, data_files=str(path), split="train")  # a single file is one split
    try:
        return datasets.load_dataset(str(source), config.subset, split=config.split)
    except Exception as exc:  # noqa: BLE001 - datasets raises many types; the cause is kept
        raise ValueError(f"[env.tasks] cannot load dataset {str(source)!r} (split {config.split!r}): {exc}. Give a "
                         "Hub id (in the local cache when offline), a data file or a saved dataset folder") from exc
