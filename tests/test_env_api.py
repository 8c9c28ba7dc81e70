"""Misuses of the Env API a new user meets, each made loud: a reward recorded twice, a trainable seat never called,
an async finalize, a wrong seat name, constant rewards, a trace without recorded temperatures scored by a teacher;
and the schedule of the envs' held-out evaluations."""

import copy
import logging

import pytest
import torch

import multiagent_rl as mrl
from multiagent_rl.episodes.trace import Segment, Trace
from multiagent_rl.rollout import Orchestrator, RunHealth
from multiagent_rl.training.trainer import MixedAlgorithmTrainer


def scripted(text="hi"):
    return mrl.make_agent(mrl.AgentConfig(model="scripted", policy=lambda turn: text))


def play(env, roles=("agent",)):
    tasks = [mrl.Task(mrl.TaskData(prompt="x"))]
    return mrl.run_sync(mrl.play_episodes(env, tasks, {r: scripted() for r in roles},
                                          trainable={r: True for r in roles}))[0]


def test_a_reward_recorded_twice_under_one_name_is_an_error_not_a_sum():
    class Twice(mrl.Env):
        roles = ("agent",)

        async def run(self, task, agents):
            trace = await agents["agent"].run(task)
            trace.add_reward("score", 0.25)
            trace.add_reward("score", 0.75)

    ep = play(Twice())
    assert not ep.ok and "reward 'score' is already recorded" in ep.errors[0]


def test_an_async_finalize_is_awaited_and_its_rewards_count():
    class Later(mrl.Env):
        roles = ("agent",)

        async def run(self, task, agents):
            await agents["agent"].run(task)

        async def finalize(self, task, episode):
            episode.traces[0].add_reward("late", 0.5)

    ep = play(Later())
    assert ep.ok and ep.traces[0].reward == 0.5


def test_a_wrong_seat_name_names_the_envs_seats():
    class Typo(mrl.Env):
        name = "typo"
        roles = ("player_0", "player_1")

        async def run(self, task, agents):
            await agents["player"].run(task)

    ep = play(Typo(), roles=("player_0", "player_1"))
    assert not ep.ok and "env 'typo' has no seat 'player'; its seats are ['player_0', 'player_1']" in ep.errors[0]


class Lonely(mrl.Env):
    """Declares two trainable seats but only ever calls one."""

    roles = ("speaker", "listener")

    def sample_tasks(self, num, rng):
        return [mrl.Task(mrl.TaskData(prompt="x")) for _ in range(num)]

    async def run(self, task, agents):
        trace = await agents["speaker"].run(task)
        trace.add_reward("r", 1.0)


def test_a_trainable_seat_that_run_never_calls_is_warned_about_once(caplog):
    engine = Orchestrator.from_config({"model": {"name": "tiny"}, "algo": {"type": "rae"},
                                       "env": [{"id": "lonely", "instance": Lonely(), "group_size": 2}]},
                                      groups_per_step=1)
    with caplog.at_level(logging.WARNING):
        engine.play(0)
        engine.play(1)
    warnings = [r.message for r in caplog.records if "'listener' has no trace" in r.getMessage()]
    assert len(warnings) == 1 and "neither trained nor in the metrics" in caplog.text


def test_constant_rewards_in_every_group_are_warned_about_after_a_few_steps(caplog, make_trace, make_episode):
    health = RunHealth(failed_steps=2)
    flat = [make_episode(f"e{k}", "g0", "env", [make_trace("agent", [("prompt", [1, 2]), ("action", [3])], 1.0)])
            for k in range(2)]
    for ep in flat:
        ep.traces[0].streams = mrl.TokenStreams("grpo", advantages=[0.0, 0.0, 0.0])
    with caplog.at_level(logging.WARNING):
        health.after_rollout(flat, {})
        assert "every advantage was 0" not in caplog.text
        health.after_rollout(flat, {})
    assert "every advantage was 0 in 2 consecutive steps" in caplog.text and "rewards are equal" in caplog.text


def test_a_teacher_reads_tokens_without_a_recorded_temperature_as_the_student_does(tmp_path, tiny, mixed_args,
                                                                                   loss_and_grads, grad_checks):
    """A hand-built trace records no sampling temperature; the loss reads it at the trainer's (0.7), and so must an
    opd teacher equal to the student, which then pulls with a zero gradient."""
    max_grad, _ = grad_checks
    model, tok = tiny
    folder = tmp_path / "same"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    trace = Trace(role="agent", trainable=True, model="policy",
                  segments=[Segment("prompt", tok.encode("What is 2 + 2?")), Segment("action", tok.encode(" 4 and 5"))])
    trace.add_reward("r", 1.0)
    episode = mrl.Episode(id="e0", task=mrl.Task(mrl.TaskData(prompt="x")), group="g0", env="single", traces=[trace])
    env = mrl.SingleAgentEnv([{"prompt": "x"}], reward=lambda t, tr: 1.0)
    trainer = MixedAlgorithmTrainer({"algo": {"type": "opd", "teacher": str(folder)},
                                     "env": [{"id": "single", "instance": env, "group_size": 1}]},
                                    args=mixed_args(tmp_path / "run", temperature=0.7), model=copy.deepcopy(model),
                                    processing_class=tok)
    from conftest import feed

    feed(trainer, lambda step: [copy.deepcopy(episode)])
    batch = trainer._generate_and_score_completions(None)
    assert torch.all(batch["temperatures"][batch["action_mask"].bool()] == 0.7)
    _, grads = loss_and_grads(trainer, batch)
    assert max_grad(grads) < 1e-5


class _Counting:
    """A held-out evaluation that measures the step it is called at."""

    def __init__(self, **kw):
        from multiagent_rl.envs.evaluation import PeriodicEvaluation

        class Counting(PeriodicEvaluation):
            prefix = "eval/count"

            def measure(self, step):
                return {"seen": float(step)}

        self.callback = Counting(**kw)
        self.logged = []
        self.callback.trainer = type("T", (), {"accelerator": type("A", (), {"is_main_process": True})(),
                                              "record_metric": lambda _, k, v: self.logged.append((k, v))})()

    def run(self, max_steps, start=0):
        from types import SimpleNamespace

        self.callback.on_train_begin(None, SimpleNamespace(global_step=start, max_steps=max_steps), None)
        for step in range(start + 1, max_steps + 1):
            self.callback.on_step_end(None, SimpleNamespace(global_step=step, max_steps=max_steps), None)
        return [p["step"] for p in self.callback.points]


@pytest.mark.parametrize("every,during_warmup,expected", [(3, True, [0, 3, 6, 9, 10]), (4, False, [0, 6, 8, 10])])
def test_a_periodic_evaluation_measures_at_start_warmup_end_every_and_last(every, during_warmup, expected):
    counting = _Counting(every=every, warmup_steps=6, during_warmup=during_warmup)
    assert counting.run(10) == expected
    # the point before training is printed, not logged: it would be averaged into the first step's log line
    assert [v for _, v in counting.logged] == [float(s) for s in expected[1:]]
    assert {k for k, _ in counting.logged} == {"eval/count/seen"}


def test_a_resumed_periodic_evaluation_keeps_its_points_and_does_not_measure_the_start_again():
    first = _Counting(every=5)
    first.run(5)
    resumed = _Counting(every=5)
    resumed.callback.load_state_dict(first.callback.state_dict())
    assert resumed.run(10, start=5) == [0, 5, 10]
