"""The Hugging Face Hub: trace datasets with a dataset card, model cards that name the real base model.

A real push needs a token with write access (``HF_TOKEN`` in the environment, or ``huggingface-cli login``);
repositories are private unless told otherwise.

```pycon
>>> from multiagent_rl.data.traces import load_traces  # doctest: +SKIP
>>> push_traces(load_traces("outputs/kuhn_poker/traces"), "me/kuhn-traces", role="player_0",
...             min_reward=1.0)  # doctest: +SKIP
'https://huggingface.co/datasets/me/kuhn-traces'

```
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .traces import filter_traces

LIBRARY = "multiagent_rl"


def base_model_id(name: str) -> str | None:
    """The Hub id of the model a run started from: a model made here from a Hub model names it
    (``"smollm2-135m"`` → ``HuggingFaceTB/SmolLM2-135M-Instruct``); a Hub id is its own; None for the embedded tiny
    model and other local folders."""
    from ..models import base_model_of

    made_from = base_model_of(name)
    if made_from is not None or name == "tiny" or os.path.isdir(name) or name.startswith(("/", ".")):
        return made_from
    return name


def _reward_table(dataset) -> str:
    stats: dict[tuple[str, str], list[float]] = defaultdict(list)
    for env, role, reward, ok in zip(dataset["env"], dataset["role"], dataset["reward"], dataset["episode_ok"]):
        if ok and reward is not None:
            stats[(env, role)].append(reward)
    lines = ["| env | role | traces | mean reward | min | max |", "|---|---|---|---|---|---|"]
    for (env, role), values in sorted(stats.items()):
        lines.append(f"| {env} | {role} | {len(values)} | {sum(values) / len(values):.3f} | {min(values):.3f} | "
                     f"{max(values):.3f} |")
    return "\n".join(lines)


def trace_dataset_card(dataset, repo_id: str, *, produced_by: str | None = None, filters: dict | None = None) -> str:
    """A dataset card for a trace dataset: what is in it, reward statistics, how it was made, the schema."""
    from huggingface_hub import DatasetCard, DatasetCardData

    from . import traces as trace_dataset

    envs, roles = sorted(set(dataset["env"])), sorted(set(dataset["role"]))
    algorithms = sorted({a for a in dataset["algorithm"] if a})
    runs = sorted(set(dataset["run"]))
    steps = dataset["step"]
    data = DatasetCardData(tags=[LIBRARY, "multi-agent", "reinforcement-learning", "traces", *envs],
                           license="apache-2.0")
    schema = trace_dataset.__doc__.split("================  ", 1)[1]
    content = f"""---
{data.to_yaml()}
---

# {repo_id}

Token-level traces of multi-agent episodes, written by `{LIBRARY}` during training: one row
per finished agent run (a *trace*), with the conversation, every token and its kind, sampling log-probabilities,
the ids a constrained choice allowed, rewards, advantages and metrics.

- environments: {", ".join(envs)}
- roles: {", ".join(roles)}
- algorithms: {", ".join(algorithms) or "none (untrained seats only)"}
- runs: {", ".join(runs) or "(unnamed)"}; steps {min(steps) if steps else "-"} to {max(steps) if steps else "-"}
- rows: {len(dataset)}
- filters applied: {json.dumps(filters or {})}

## Rewards

{_reward_table(dataset)}

## How it was produced

```
{produced_by or " ".join(sys.argv)}
```

## Loading

```python
from datasets import load_dataset
from multiagent_rl.data.traces import dataset_to_episodes, to_sft_messages

traces = load_dataset("{repo_id}", split="train")
episodes = dataset_to_episodes(traces)   # back to multiagent_rl Episode objects, exactly
sft = to_sft_messages(traces)            # the messages format TRL's SFTTrainer takes
```

## Schema (version {trace_dataset.SCHEMA_VERSION})

================  {schema}"""
    return str(DatasetCard(content))


def push_traces(dataset, repo_id: str, *, private: bool = True, env: str | list[str] | None = None,
                role: str | list[str] | None = None, min_reward: float | None = None,
                steps: tuple[int, int] | None = None, max_shard_size: str | int = "500MB",
                token: str | None = None, produced_by: str | None = None) -> str:
    """Push a trace dataset (filtered by env, role, minimum reward and step range) with its dataset card; returns
    the dataset's URL. Private by default."""
    from huggingface_hub import HfApi

    filters = {k: v for k, v in {"env": env, "role": role, "min_reward": min_reward, "steps": steps}.items()
               if v is not None}
    chosen = filter_traces(dataset, **filters) if filters else dataset
    if len(chosen) == 0:
        raise ValueError(f"no trace matches the filters {filters}; nothing to push")
    chosen.push_to_hub(repo_id, private=private, max_shard_size=max_shard_size, token=token)
    card = trace_dataset_card(chosen, repo_id, produced_by=produced_by, filters=filters)
    api = HfApi(token=token)
    api.upload_file(path_or_fileobj=card.encode(), path_in_repo="README.md", repo_id=repo_id, repo_type="dataset",
                    commit_message="dataset card")
    return f"{api.endpoint}/datasets/{repo_id}"


def model_card_text(experiment, *, hub_model_id: str | None, results: str | None = None,
                    command: str | None = None, adapter: bool = False) -> str:
    """A model card naming the real base model, the environments, roles and algorithms, the results and the
    command that reproduces them."""
    from huggingface_hub import ModelCard, ModelCardData

    base = base_model_id(experiment.model.name)
    rows = []
    for env in experiment.env:
        label = env.name or env.id
        for role, rc in env.roles.items():
            algo = experiment.algorithm_for(env, role).type if experiment.seat_trainable(env, role) else "frozen"
            rows.append(f"| {label} | {role} | {rc.model} | {algo} |")
        rows.append(f"| {label} | other seats | policy | {experiment.algorithm_for(env, None).type} |")
    tags = [LIBRARY, "trl", "multi-agent", "reinforcement-learning", *sorted({e.id for e in experiment.env})]
    data = ModelCardData(base_model=base, library_name="peft" if adapter else "transformers", tags=tags,
                         license="apache-2.0")
    origin = (f"a fine-tuned version of [{base}](https://huggingface.co/{base})" if base
              else "a fine-tuned version of the embedded tiny model of multiagent_rl (no Hub base model)"
              if experiment.model.name == "tiny" else f"a fine-tuned version of the local model {experiment.model.name}")
    content = f"""---
{data.to_yaml()}
---

# {hub_model_id or "model"}

This {"LoRA adapter" if adapter else "model"} is {origin}, trained with `{LIBRARY}` (on TRL) in multi-agent
environments.

| environment | role | played by | algorithm |
|---|---|---|---|
{chr(10).join(rows)}

## Results

{results or "No results were recorded for this run."}

## Reproduce

```
{command or " ".join(sys.argv)}
```
"""
    return str(ModelCard(content))


def fix_adapter_base(folder: str | os.PathLike, base: str | None) -> None:
    """Point a saved LoRA adapter at its base model's Hub id (PEFT writes the local path it was loaded from)."""
    path = Path(folder) / "adapter_config.json"
    if base is None or not path.exists():
        return
    config: dict[str, Any] = json.loads(path.read_text())
    config["base_model_name_or_path"] = base
    path.write_text(json.dumps(config, indent=2, sort_keys=True))


@contextlib.contextmanager
def without_traces() -> Iterator[None]:
    """While inside, ``huggingface_hub``'s ``upload_folder`` (what ``Trainer.push_to_hub`` calls with fixed ignore
    patterns) leaves a run's traces and episode logs out: they are a dataset of their own ([`push_traces`][multiagent_rl.data.hub.push_traces])."""
    from transformers.utils import hub as transformers_hub

    api = transformers_hub.hf_api()
    original = api.upload_folder

    def upload_folder(*args, ignore_patterns=None, **kw):
        return original(*args, ignore_patterns=list(ignore_patterns or []) + ["traces/*", "episodes/*"], **kw)

    api.upload_folder = upload_folder
    try:
        yield
    finally:
        api.upload_folder = original
