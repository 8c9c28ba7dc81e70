"""Shared test fixtures: the tiny model, hand-built traces and episodes, trainers fed fixed episodes.

The helpers are plain functions (``tests/_two_process_check.py``, a torchrun script, imports them
from here) exposed to tests as fixtures of the same name.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import copy  # noqa: E402
from collections.abc import Callable  # noqa: E402

import pytest  # noqa: E402


def make_trace(role: str, segments, reward: float, model: str = "policy"):
    """A trainable trace from ``[(kind, token ids), ...]``; actions get sampling logprobs of -1."""
    from multiagent_rl.episodes.trace import Segment, Trace

    t = Trace(role=role, trainable=True, model=model,
              segments=[Segment(k, list(ids), [-1.0] * len(ids) if k == "action" else None) for k, ids in segments])
    t.add_reward("outcome", reward)
    return t


def make_episode(eid: str, group: str, env: str, traces):
    """An episode of env label ``env`` in task group ``group``."""
    from multiagent_rl.episodes.episode import Episode
    from multiagent_rl.tasks.task import Task, TaskData

    return Episode(id=eid, task=Task(TaskData(prompt="p")), group=group, env=env, traces=traces)


def user_sim_traces(per_policy: int = 6):
    """A trace dataset of menu-mode user-sim conversations: step 0 the careful assistant (every booking right),
    step 1 an always-hasty one (mostly wrong), ``per_policy`` conversations each."""
    import random

    import multiagent_rl as mrl
    from multiagent_rl.envs.user_sim import UserSimEnv, careful_assistant, hasty_assistant, scripted_user
    from multiagent_rl.data.traces import episodes_to_dataset

    env = UserSimEnv(menu=True)
    pairs = []
    for step, policy in enumerate((careful_assistant(), hasty_assistant(patience=0.0))):
        agents = {"user": mrl.make_agent(mrl.AgentConfig(model="scripted", policy=scripted_user())),
                  "assistant": mrl.make_agent(mrl.AgentConfig(model="scripted", policy=policy))}
        episodes = mrl.run_sync(mrl.play_episodes(env, env.sample_tasks(per_policy, random.Random(step)), agents,
                                                  seed="0", trainable={"user": False, "assistant": True}))
        pairs += [(step, ep) for ep in episodes]
    return episodes_to_dataset(pairs, run="demo")


def mixed_args(output_dir, **kw):
    """A MixedAlgorithmConfig for fast CPU tests (no saving, one step unless told otherwise)."""
    from multiagent_rl.training.trainer import MixedAlgorithmConfig

    base = dict(output_dir=str(output_dir), report_to=[], save_strategy="no", save_episodes=False,
                logging_steps=1, disable_tqdm=True, seed=0, max_completion_length=8, max_steps=1)
    return MixedAlgorithmConfig(**{**base, **kw})


def feed(trainer, episodes_for: Callable[[int], list]):
    """Make ``trainer``'s rollout engine play no environment: each step's episodes are ``episodes_for(step)``,
    checked and scored exactly as played ones are."""
    rollout = trainer.rollout

    async def aplay(step):
        episodes = episodes_for(step)
        for ep in episodes:
            rollout._check(ep)
            for key, roles in rollout.slot_of[ep.env].assignment.items():
                await rollout.algorithms[key].score_episode(ep, roles)
        return episodes

    rollout.aplay = aplay
    return trainer


def fixed_trainer(output_dir, tiny, experiment, episodes, regulariser=None, **kw):
    """A trainer on a copy of the tiny model whose every step plays (a fresh copy of) ``episodes``
    (or ``episodes(step)`` when it is callable); ``regulariser`` is the experiment's ``[[regulariser]]`` list."""
    from multiagent_rl.config import ExperimentConfig
    from multiagent_rl.training.trainer import MixedAlgorithmTrainer

    if regulariser is not None:
        experiment = ExperimentConfig.model_validate(experiment) if isinstance(experiment, dict) else experiment
        experiment = experiment.model_copy(update={"regulariser": ExperimentConfig.model_validate(
            {"env": [{"id": "kuhn_poker"}], "regulariser": regulariser}).regulariser})
    model, tok = tiny
    source = episodes if callable(episodes) else (lambda step: copy.deepcopy(episodes))
    trainer = MixedAlgorithmTrainer(experiment, args=mixed_args(output_dir, **kw), model=copy.deepcopy(model),
                                    processing_class=tok)
    return feed(trainer, source)


def loss_and_grads(trainer, inputs, accumulation: int = 1):
    """``trainer._compute_loss`` in train mode on ``inputs``, then backward: (loss, {param name: grad})."""
    trainer.current_gradient_accumulation_steps = accumulation  # set by the training loop otherwise
    model = trainer.model
    model.train()
    model.zero_grad(set_to_none=True)
    loss = trainer._compute_loss(model, inputs)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def max_grad_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[n] - b[n]).abs().max().item() for n in a)


def max_grad(a: dict) -> float:
    return max(g.abs().max().item() for g in a.values())


@pytest.fixture(scope="session")
def tiny():
    """The embedded tiny model and tokenizer (built once per machine, loaded once per session)."""
    from multiagent_rl.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer("tiny")
    return model.eval(), tok


@pytest.fixture
def backend(tiny):
    from multiagent_rl.backends import TransformersBackend

    model, tok = tiny
    return TransformersBackend(model, tok, model_id="tiny")


@pytest.fixture(name="make_trace")
def _make_trace():
    return make_trace


@pytest.fixture(name="make_episode")
def _make_episode():
    return make_episode


@pytest.fixture(name="mixed_args")
def _mixed_args():
    return mixed_args


@pytest.fixture(name="fixed_trainer")
def _fixed_trainer():
    return fixed_trainer


@pytest.fixture(name="feed")
def _feed():
    return feed


@pytest.fixture(name="loss_and_grads")
def _loss_and_grads():
    return loss_and_grads


@pytest.fixture(name="grad_checks")
def _grad_checks():
    """``(max_grad, max_grad_diff)``."""
    return max_grad, max_grad_diff
