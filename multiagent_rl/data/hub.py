"""The Hugging Face Hub: trace datasets with a dataset card, model cards that name the real base model and its license.

A real push needs a token with write access (``HF_TOKEN`` in the environment, or ``huggingface-cli login``); new
repositories, datasets and models alike, are private unless told otherwise.

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
import logging
import os
import shlex
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .traces import SCHEMA_VERSION, filter_traces, schema_table

LIBRARY = "multiagent_rl"
LIBRARY_LICENSE = "apache-2.0"
"""This package's license: also the embedded tiny model's, which is made here from nothing."""
logger = logging.getLogger(__name__)


def base_model_id(name: str) -> str | None:
    """The Hub id of the model a run started from: a model made here from a Hub model names it
    (``"smollm2-135m"`` → ``HuggingFaceTB/SmolLM2-135M-Instruct``); a Hub id is its own; None for the embedded tiny
    model and other local folders."""
    from ..models import base_model_of

    made_from = base_model_of(name)
    if made_from is not None or name == "tiny" or os.path.isdir(name) or name.startswith(("/", ".")):
        return made_from
    return name


def _known_licenses() -> dict[str, str]:
    """The licenses of the Hub models this package builds models from (no network needed for these)."""
    from ..models import SMOLLM2_BASE_MODEL

    return {SMOLLM2_BASE_MODEL: "apache-2.0"}


def _card_license(text: str) -> str | None:
    from huggingface_hub import ModelCard

    license_ = ModelCard(text, ignore_metadata_errors=True).data.license
    return license_ if isinstance(license_, str) else None


def base_model_license(name: str) -> str | None:
    """The license of the model a run started from, where it can be known: the tiny model's is this package's; a
    local folder's is in its ``README.md`` front matter or its ``ready.json`` (the record of a model converted
    here), else its base's; a Hub model's is known for the bases this package uses and read from the model's card
    otherwise (the Hub, or the local cache offline). None when it cannot be read."""
    if name == "tiny":
        return LIBRARY_LICENSE
    folder = Path(name).expanduser()
    if folder.is_dir():
        found = None
        with contextlib.suppress(OSError, ValueError):
            found = _card_license((folder / "README.md").read_text())
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            found = found or json.loads((folder / "ready.json").read_text())["license"]
        if found:
            return found
    base = base_model_id(name)
    if base is None:
        return None
    if base in _known_licenses():
        return _known_licenses()[base]
    try:
        from huggingface_hub import ModelCard

        license_ = ModelCard.load(base, ignore_metadata_errors=True).data.license
    except Exception:  # noqa: BLE001 - offline, gated, missing: unknown, and the caller says so
        return None
    return license_ if isinstance(license_, str) else None


def default_command() -> str:
    """This process's command line as it would be typed again: ``python recipes/x.py --flag v``, ``python -m
    module ...`` or the console script's name and its arguments."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    argv0 = sys.argv[0] if sys.argv else ""
    if spec is not None and spec.name:
        head = f"python -m {spec.name.removesuffix('.__main__')}"
    elif argv0.endswith(".py"):
        relative = os.path.relpath(argv0)
        head = "python " + shlex.quote(argv0 if relative.startswith("..") else relative)
    else:
        head = os.path.basename(argv0) or "python"
    return " ".join([head, *map(shlex.quote, sys.argv[1:])])


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


_SIZES = [(1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"),
          (10_000_000, "1M<n<10M"), (100_000_000, "10M<n<100M"), (1_000_000_000, "100M<n<1B")]


def size_category(rows: int) -> str:
    """The Hub's ``size_categories`` bucket of a dataset with ``rows`` rows."""
    return next((name for limit, name in _SIZES if rows < limit), "n>1B")


def trace_dataset_card(dataset, repo_id: str, *, produced_by: str | None = None, filters: dict | None = None,
                       card_data=None, license: str | None = "apache-2.0") -> str:
    """A dataset card for a trace dataset: what is in it, reward statistics, how it was made, the schema (a
    Markdown table). ``card_data`` is the metadata already in the repository's card (``datasets.push_to_hub`` writes
    ``dataset_info`` and ``configs``, which the Hub's viewer and ``load_dataset`` read): it is kept, and the Hub's
    ``pretty_name``, ``task_categories``, ``size_categories``, ``tags`` and ``license`` are added."""
    from huggingface_hub import DatasetCard, DatasetCardData

    envs, roles = sorted(set(dataset["env"])), sorted(set(dataset["role"]))
    algorithms = sorted({a for a in dataset["algorithm"] if a})
    runs = sorted(set(dataset["run"]))
    steps = dataset["step"]
    data = card_data if card_data is not None else DatasetCardData()
    data.pretty_name = f"{repo_id.split('/')[-1]}: multi-agent RL traces of {', '.join(envs)}"
    data.task_categories = sorted(set(data.task_categories or []) | {"reinforcement-learning", "text-generation"})
    data.size_categories = [size_category(len(dataset))]
    ours = [LIBRARY, "multi-agent", "reinforcement-learning", "traces", *envs]
    data.tags = list(dict.fromkeys([*(getattr(data, "tags", None) or []), *ours]))
    if license:
        data.license = license
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
{produced_by or default_command()}
```

## Loading

```python
from datasets import load_dataset
from multiagent_rl.data.traces import dataset_to_episodes, to_sft_messages

traces = load_dataset("{repo_id}", split="train")
episodes = dataset_to_episodes(traces)   # back to multiagent_rl Episode objects, exactly
sft = to_sft_messages(traces)            # the messages format TRL's SFTTrainer takes
```

## Schema (version {SCHEMA_VERSION})

{schema_table()}
"""
    return str(DatasetCard(content))


def push_traces(dataset, repo_id: str, *, private: bool = True, env: str | list[str] | None = None,
                role: str | list[str] | None = None, model: str | list[str] | None = None,
                min_reward: float | None = None, steps: tuple[int, int] | None = None,
                max_shard_size: str | int = "500MB", token: str | None = None, produced_by: str | None = None,
                license: str | None = "apache-2.0") -> str:
    """Push a trace dataset (filtered as [`filter_traces`][multiagent_rl.data.traces.filter_traces] does) with its
    dataset card; returns the dataset's URL. Private by default, as pushed models are. The card ``datasets`` wrote
    (its ``dataset_info`` and ``configs``) is read back and kept, with this package's card added to it."""
    from huggingface_hub import DatasetCard, HfApi

    filters = {k: v for k, v in {"env": env, "role": role, "model": model, "min_reward": min_reward,
                                 "steps": steps}.items() if v is not None}
    chosen = filter_traces(dataset, **filters) if filters else dataset
    if len(chosen) == 0:
        raise ValueError(f"no trace matches the filters {filters}; nothing to push")
    chosen.push_to_hub(repo_id, private=private, max_shard_size=max_shard_size, token=token)
    try:
        written = DatasetCard.load(repo_id, repo_type="dataset", token=token, ignore_metadata_errors=True).data
    except Exception:  # noqa: BLE001 - no card to keep (an older datasets writes none): ours alone
        logger.warning("%s: no dataset card from datasets.push_to_hub to keep; writing ours alone", repo_id)
        written = None
    card = trace_dataset_card(chosen, repo_id, produced_by=produced_by, filters=filters, card_data=written,
                              license=license)
    api = HfApi(token=token)
    api.upload_file(path_or_fileobj=card.encode(), path_in_repo="README.md", repo_id=repo_id, repo_type="dataset",
                    commit_message="dataset card")
    return f"{api.endpoint}/datasets/{repo_id}"


_UNLICENSED: set[str] = set()  # models whose unknown license was warned about


def _env_seats(spec) -> tuple[str, ...]:
    """The seats of an ``[[env]]`` entry's environment, without building it."""
    return tuple(spec.instance.roles if spec.instance is not None else spec.env_class().roles)


def model_card_text(experiment, *, hub_model_id: str | None, results: str | None = None,
                    command: str | None = None, adapter: bool = False, datasets: list[str] | None = None,
                    license: str | None = None, seats: dict[str, tuple[str, ...]] | None = None,
                    policy: str | None = None) -> str:
    """A model card naming the real base model and its license, the environments with every seat (who plays it, with
    which algorithm), the datasets (the run's pushed traces), the results and the command that reproduces them.

    ``license`` defaults to the base model's ([`base_model_license`][multiagent_rl.data.hub.base_model_license]); when
    that cannot be read, the card has none and a warning says so. ``seats`` (env label → seats) defaults to the env
    classes' ``roles``. ``policy``: the card of that one of a run's several ``[policies]`` (the seats table says which
    policy plays each seat, and the card which of them this model is)."""
    from huggingface_hub import ModelCard, ModelCardData

    from ..config import env_labels

    name = experiment.policy_base(policy) if policy is not None else experiment.model.name
    base = base_model_id(name)
    license = license or base_model_license(name)
    if license is None and name not in _UNLICENSED:  # once per model: a run writes several cards
        _UNLICENSED.add(name)
        logger.warning("model card: the license of %s is unknown (its base model's card could not be read, e.g. "
                       "offline); the card leaves `license` out. Set trainer.model_card_license = '<the base "
                       "model's license>' (e.g. 'llama3.2') before pushing.", name)
    rows = []
    for label, env in zip(env_labels(experiment), experiment.env):
        for role in (seats or {}).get(label) or _env_seats(env):
            rc = env.roles.get(role)
            algo = experiment.algorithm_for(env, role).type if experiment.seat_trainable(env, role) else "frozen"
            played = rc.model if rc else "policy"
            if policy is not None and played == "policy":
                played = f"policy `{experiment.policy_of_seat(env, role)}`"
            rows.append(f"| {label} | {role} | {played} | {algo} |")
    tags = [LIBRARY, "trl", "multi-agent", "reinforcement-learning", *sorted({e.id for e in experiment.env})]
    data = ModelCardData(base_model=base, library_name="peft" if adapter else "transformers", tags=tags,
                         license=license, pipeline_tag="text-generation", datasets=list(datasets) if datasets else None)
    origin = (f"a fine-tuned version of [{base}](https://huggingface.co/{base})" if base
              else "a fine-tuned version of the embedded tiny model of multiagent_rl (no Hub base model)"
              if name == "tiny" else f"a fine-tuned version of the local model {name}")
    trained_on = (f"\n\nThe episodes it was trained on: {', '.join(f'[{d}](https://huggingface.co/datasets/{d})' for d in datasets)}."
                  if datasets else "")
    unlicensed = ("\n\n**License: not set.** The base model's license could not be read; set it (the base model's "
                  "terms apply to this model) before sharing." if license is None else "")
    each = "its own full model" if experiment.uses_full_models else "a LoRA adapter on the same base model"
    policy_line = (f"\n\nIt is the policy `{policy}` of a run that trained {len(experiment.policy_names())} policies "
                   f"({', '.join(f'`{n}`' for n in experiment.policy_names())}), each {each}, each trained only on "
                   "its own seats." if policy is not None else "")
    content = f"""---
{data.to_yaml()}
---

# {hub_model_id or "model"}

This {"LoRA adapter" if adapter else "model"} is {origin}, trained with `{LIBRARY}` (on TRL) in multi-agent
environments.{trained_on}{unlicensed}{policy_line}

| environment | role | played by | algorithm |
|---|---|---|---|
{chr(10).join(rows)}

## Results

{results or "No results were recorded for this run."}

## Reproduce

```
{command or default_command()}
```
"""
    return str(ModelCard(content))


TRAINED_ON = "trained_on.json"
"""Beside a saved LoRA adapter: the model reference it was trained on, when that differs from the Hub id its
``adapter_config.json`` names (a built-in name such as ``smollm2-135m``, whose weights are a local conversion), so
[`load_model_and_tokenizer`][multiagent_rl.models.load_model_and_tokenizer] reloads it on the same weights offline."""


def fix_adapter_base(folder: str | os.PathLike, base: str | None, trained_on: str | None = None) -> None:
    """Point a saved LoRA adapter at its base model's Hub id (PEFT writes the local path it was loaded from), and
    record ``trained_on`` (the run's model reference) beside it when that is not the same id."""
    path = Path(folder) / "adapter_config.json"
    if base is None or not path.exists():
        return
    config: dict[str, Any] = json.loads(path.read_text())
    config["base_model_name_or_path"] = base
    path.write_text(json.dumps(config, indent=2, sort_keys=True))
    if trained_on is not None and trained_on != base:
        (Path(folder) / TRAINED_ON).write_text(json.dumps({"model": trained_on}) + "\n")


@contextlib.contextmanager
def without_traces() -> Iterator[None]:
    """While inside, ``huggingface_hub``'s ``upload_folder`` (what ``Trainer.push_to_hub`` calls with fixed ignore
    patterns) leaves a run's traces and episode logs out: they are a dataset of their own ([`push_traces`][multiagent_rl.data.hub.push_traces]).
    ``final_model/`` stays out too: ``push_to_hub`` has just saved the same weights at the folder's root."""
    from transformers.utils import hub as transformers_hub

    api = transformers_hub.hf_api()
    original = api.upload_folder

    def upload_folder(*args, ignore_patterns=None, **kw):
        return original(*args, ignore_patterns=list(ignore_patterns or []) + ["traces/*", "episodes/*", "final_model/*"],
                        **kw)

    api.upload_folder = upload_folder
    try:
        yield
    finally:
        api.upload_folder = original
