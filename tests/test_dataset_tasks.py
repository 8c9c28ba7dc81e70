"""Tasks from datasets: a local data file, a saved dataset folder or a datasets.Dataset, with a column mapping, for any
environment; drawn with the engine's checkpointed random stream."""

import datasets
import pytest

import multiagent_rl as mrl
from multiagent_rl.config import ExperimentConfig
from multiagent_rl.rollout import Orchestrator
from multiagent_rl.tasks.datasets import DatasetTasks, DatasetTasksConfig


class EchoAnswer(mrl.Env):
    """Rewards a reply equal to the task's answer (the scripted seat below replies with it)."""

    name = "echo_answer"
    roles = ("agent",)

    async def run(self, task, agents):
        trace = await agents["agent"].run(task)
        trace.add_reward("right", float(trace.last_reply == task.data.answer))


def answer_of(turn):
    return turn.task.data.answer


ROWS = {"question": [f"What is {a} + {a}?" for a in range(10)], "answer": [str(2 * a) for a in range(10)],
        "level": list(range(10))}


def experiment(tasks, seed=0):
    return ExperimentConfig.model_validate({
        "env": [{"id": "test_dataset_tasks:EchoAnswer", "group_size": 2, "tasks": tasks,
                 "roles": {"agent": {"model": "scripted", "policy": answer_of, "trainable": False}}}],
        "trainer": {"max_steps": 1}})


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "saved folder", "dataset object"])
def test_an_env_draws_its_tasks_from_a_dataset_with_a_column_mapping(tmp_path, kind):
    rows = datasets.Dataset.from_dict(ROWS)
    source = {"jsonl": tmp_path / "qa.jsonl", "parquet": tmp_path / "qa.parquet", "saved folder": tmp_path / "qa",
              "dataset object": rows}[kind]
    if kind == "jsonl":
        rows.to_json(str(source))
    elif kind == "parquet":
        rows.to_parquet(str(source))
    elif kind == "saved folder":
        rows.save_to_disk(str(source))
    tasks = {"dataset": source if kind == "dataset object" else str(source), "prompt": "question", "answer": "answer"}
    engine = Orchestrator.from_config(experiment(tasks), groups_per_step=3)
    episodes = engine.play(0)
    assert len(episodes) == 6 and all(ep.ok for ep in episodes)
    for ep in episodes:
        data = ep.task.data
        assert data.prompt in ROWS["question"] and data.answer == str(2 * data.info["level"])
        assert ep.traces[0].reward == 1.0
    # the draws come from the engine's random stream (saved in checkpoints): a restored stream draws the same tasks
    state = engine.state_dict()
    first = [ep.task.data.prompt for ep in engine.play(1)]
    engine.load_state_dict(state)
    assert [ep.task.data.prompt for ep in engine.play(1)] == first


def test_dataset_task_errors_name_the_column_or_the_source(tmp_path):
    rows = datasets.Dataset.from_dict(ROWS)
    with pytest.raises(ValueError, match=r"no column \['query'\]; its columns are \['question', 'answer', 'level'\]"):
        DatasetTasks.from_dataset(rows, DatasetTasksConfig(prompt="query"))
    with pytest.raises(ValueError, match="cannot load dataset 'no/such-dataset'"):
        Orchestrator.from_config(experiment({"dataset": "no/such-dataset", "prompt": "question"}))
    with pytest.raises(ValueError, match="tasks.promt"):
        experiment({"dataset": "x", "promt": "question"})
    limited = DatasetTasks.from_dataset(rows, DatasetTasksConfig(prompt="question", info=["level"], limit=3))
    assert len(limited.tasks) == 3 and limited.tasks[2].info == {"level": 2} and limited.tasks[0].answer is None
