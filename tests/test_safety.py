"""Nothing silently corrupts a run: rewards, settings, numerics, timeouts, limits, trace files, the console.

Each test names the item of the safety issue it covers. They train the embedded tiny model for a
few steps on CPU, or check what a config, an episode or a log file holds.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import math
import random
import time
from pathlib import Path

import pydantic
import pytest
import torch

import multiagent_rl as mrl
from multiagent_rl.envs import base as env_module
from multiagent_rl.config import ExperimentConfig
from multiagent_rl.envs.base import SingleAgentEnv, run_sync
from multiagent_rl.rollout.health import RunStopped
from multiagent_rl.models import ModelNotFoundError, load_model_and_tokenizer
from multiagent_rl.data.sinks import load_episode_logs, read_episodes, read_records
from multiagent_rl.training.trainer import MixedAlgorithmConfig, MixedAlgorithmTrainer



@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def args(tmp_path, **kw) -> MixedAlgorithmConfig:
    base = dict(output_dir=str(tmp_path / "run"), report_to=[], save_strategy="no", save_episodes=False,
                logging_steps=1, disable_tqdm=True, seed=0, max_completion_length=4, max_steps=2, learning_rate=1e-3,
                groups_per_step=4)
    return MixedAlgorithmConfig(**{**base, **kw})


def trainer_for(tmp_path, tiny, experiment, **kw) -> MixedAlgorithmTrainer:
    model, tok = tiny
    return MixedAlgorithmTrainer(experiment, args=args(tmp_path, **kw), model=copy.deepcopy(model),
                                 processing_class=tok)


def prompts(n=8):
    return [{"prompt": f"What is {a} + {a}?"} for a in range(n)]


def all_finite(model) -> bool:
    return all(torch.isfinite(p).all() for p in model.parameters())


class FlakyRewards(mrl.Env):
    """30% of episodes record a non-finite reward (NaN, +inf, -inf in turn); the rest a varied finite one."""

    name = "flaky"
    roles = ("agent",)

    def __init__(self):
        self.played = 0

    def sample_tasks(self, num, rng):
        return [mrl.Task(mrl.TaskData(prompt="Say something.")) for _ in range(num)]

    async def run(self, task, agents):
        trace = await agents["agent"].run(task)
        self.played += 1
        k = self.played % 10
        bad = {0: math.nan, 3: math.inf, 6: -math.inf}
        if k in bad:
            trace.rewards.append(mrl.RewardRecord("score", bad[k]))  # bypasses add_reward's own check
        else:
            trace.add_reward("score", float(k))


# -- item 1: non-finite rewards ---------------------------------------------------------------------


@pytest.mark.parametrize("algo", ["grpo", "rae"])
def test_nonfinite_rewards_fail_their_episode_and_never_reach_the_weights(tmp_path, tiny, algo):
    env = FlakyRewards()
    trainer = trainer_for(tmp_path, tiny, {"algo": {"type": algo}, "env": [{"id": "flaky", "instance": env,
                                                                              "group_size": 5}]})
    trainer.train()
    assert all_finite(trainer.model)
    failed = [ep for ep in trainer.rollout.last_episodes if not ep.ok]
    assert len(failed) == 6 and len(trainer.rollout.last_episodes) == 20  # 30% of 20
    for ep in failed:
        assert ep.errors[0].startswith("env 'flaky': ValueError: role 'agent': reward 'score' is "), ep.errors
        assert any(v in ep.errors[0] for v in ("nan", "inf", "-inf"))
        assert ep.traces[0].streams is None  # never credited
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["flaky/failed_episodes"] for h in logs] == [6.0, 6.0]
    assert all(math.isfinite(h["loss"]) and math.isfinite(h["loss/rl"]) for h in logs)
    for state in trainer.rollout.algorithm_state().values():
        assert all(math.isfinite(b) for b in state.get("baselines", {}).values())
    with pytest.raises(ValueError, match="reward 'x' is nan, not a finite number"):
        mrl.Trace(role="a").add_reward("x", float("nan"))


def test_a_nonfinite_loss_skips_the_step_and_k_in_a_row_stop_the_run(tmp_path, tiny):
    experiment = {"algo": {"type": "grpo"}, "env": [{"id": "s", "instance": SingleAgentEnv(
        prompts(), reward=lambda task, trace: float(len(trace.last_reply) % 3)), "group_size": 4}]}
    trainer = trainer_for(tmp_path, tiny, experiment, max_steps=4, max_skipped_steps=3, save_strategy="no")
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    poisoned = {1, 2}  # steps whose loss is NaN
    original = trainer._compute_loss

    def compute_loss(model, inputs):
        if trainer.state.global_step in poisoned:
            inputs = dict(inputs, advantages=inputs["advantages"] * float("nan"))
        return original(model, inputs)

    trainer._compute_loss = compute_loss
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h.get("health/skipped_steps", 0) for h in logs] == [0, 1, 2, 2]
    assert all_finite(trainer.model)
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])]
    assert changed  # steps 0 and 3 trained

    # Now every step is poisoned: the run stops after max_skipped_steps, saving finite, untouched weights.
    trainer = trainer_for(tmp_path / "b", tiny, experiment, max_steps=6, max_skipped_steps=2)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    original_b = trainer._compute_loss
    trainer._compute_loss = lambda model, inputs: original_b(model, dict(inputs, advantages=inputs["advantages"] * math.inf))
    with pytest.raises(RunStopped, match=r"2 consecutive optimizer steps were skipped because the loss was not finite"):
        trainer.train()
    assert all(torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())
    assert trainer.state.global_step == 1  # the second step's update was the second skipped one
    assert (tmp_path / "b" / "run" / "checkpoint-1" / "model.safetensors").exists()


# -- item 2: temperature 0 on a trained seat -------------------------------------------------------


def test_temperature_zero_is_refused_for_trained_seats_only():
    base = {"env": [{"id": "kuhn_poker"}]}
    with pytest.raises(pydantic.ValidationError, match=r"\[trainer\] temperature = 0.*greedy decoding is for eval"):
        ExperimentConfig.model_validate({**base, "trainer": {"temperature": 0.0}})
    with pytest.raises(pydantic.ValidationError, match=r"role 'player_1'.*sampling.temperature = 0"):
        ExperimentConfig.model_validate({"env": [{"id": "kuhn_poker", "roles": {
            "player_1": {"sampling": {"temperature": 0.0}}}}]})
    with pytest.raises(ValueError, match=r"^temperature = 0.0: the policy is trained on its own samples"):
        MixedAlgorithmConfig(output_dir="x", max_steps=1, temperature=0.0)
    # a frozen seat may decode greedily
    ExperimentConfig.model_validate({"env": [{"id": "kuhn_poker", "roles": {
        "player_1": {"model": "tiny", "sampling": {"temperature": 0.0}}}}]})


# -- item 3: an env that records no reward ---------------------------------------------------------


class SometimesNoReward(mrl.Env):
    """The trained `agent` gets a reward in half the episodes; the frozen `critic` never gets one."""

    name = "forgetful"
    roles = ("agent", "critic")

    def __init__(self, always_forget=False):
        self.n, self.always_forget = 0, always_forget

    def sample_tasks(self, num, rng):
        return [mrl.Task(mrl.TaskData(prompt="Say something.")) for _ in range(num)]

    async def run(self, task, agents):
        trace = await agents["agent"].run(task)
        await agents["critic"].run(task)
        self.n += 1
        if not self.always_forget and self.n % 2:
            trace.add_reward("r", float(self.n % 3))


def test_a_trained_seat_without_a_reward_fails_its_episode_not_the_run(tmp_path, tiny):
    critic = {"model": "scripted", "policy": lambda turn: "ok"}
    env = SometimesNoReward()
    trainer = trainer_for(tmp_path, tiny, {"env": [{"id": "f", "instance": env, "group_size": 4,
                                                     "roles": {"critic": critic}}]})
    trainer.train()
    bad = [ep for ep in trainer.rollout.last_episodes if not ep.ok]
    assert len(bad) == 8
    assert all("role 'agent' recorded no reward, but grpo computes credit from rewards" in ep.errors[0] for ep in bad)
    good = [ep for ep in trainer.rollout.last_episodes if ep.ok]
    assert all(isinstance(t.reward, float) for ep in good for t in ep.traces)  # the critic's is 0.0, a float
    assert mrl.Trace().reward == 0.0 and isinstance(mrl.Trace().reward, float)

    # every episode without reward: the run stops and says why
    trainer = trainer_for(tmp_path / "b", tiny, {"env": [{"id": "f", "instance": SometimesNoReward(always_forget=True),
                                                           "group_size": 2, "roles": {"critic": critic}}]},
                          max_steps=5, max_failed_steps=2)
    with pytest.raises(RunStopped, match=r"every episode of env 'f' failed in 2 consecutive steps.*recorded no reward"):
        trainer.train()


# -- item 4: settings that train nothing ----------------------------------------------------------


def test_settings_that_train_nothing_are_refused_at_load(tmp_path, tiny):
    with pytest.raises(pydantic.ValidationError, match=r"role 'player_0'.*group_size = 1.*every advantage would be 0"):
        ExperimentConfig.model_validate({"env": [{"id": "kuhn_poker", "group_size": 1,
                                                  "roles": {"player_0": {}}}]})
    with pytest.raises(pydantic.ValidationError, match=r"names algo 'sft' but trainable = false"):
        ExperimentConfig.model_validate({"env": [{"id": "kuhn_poker", "roles": {"player_0": {
            "model": "scripted", "policy": "multiagent_rl.envs.kuhn_poker:random_policy", "trainable": False,
            "algo": {"type": "sft"}}}}]})
    # unlisted seats are checked against the env's real seats when the trainer binds them
    with pytest.raises(ValueError, match=r"role 'player_1'.*group_size = 1"):
        trainer_for(tmp_path, tiny, {"env": [{"id": "kuhn_poker", "group_size": 1, "roles": {"player_0": {
            "model": "scripted", "policy": "multiagent_rl.envs.kuhn_poker:random_policy"}}}]})
    # rae needs no group; a scripted seat that names its own algorithm is trained
    exp = ExperimentConfig.model_validate({"algo": {"type": "rae"}, "env": [{"id": "kuhn_poker", "group_size": 1,
                                          "roles": {"player_0": {"model": "scripted", "algo": {"type": "sft"},
                                                                 "policy": "multiagent_rl.envs.kuhn_poker:random_policy"}}}]})
    assert exp.seat_trainable(exp.env[0], "player_0")
    # the env's own algorithm makes its scripted seats imitated, too
    exp = ExperimentConfig.model_validate({"env": [{"id": "kuhn_poker", "algo": {"type": "sft"}, "roles": {
        seat: {"model": "scripted", "policy": "multiagent_rl.envs.kuhn_poker:random_policy"}
        for seat in ("player_0", "player_1")}}]})
    assert exp.seat_trainable(exp.env[0], "player_0") and exp.seat_trainable(exp.env[0], "player_1")


def test_a_run_where_every_episode_fails_stops_with_the_cause(tmp_path, tiny):
    returns_int = {"model": "scripted", "policy": lambda turn: 7, "algo": {"type": "sft"}}
    trainer = trainer_for(tmp_path, tiny, {"env": [{"id": "kuhn_poker", "group_size": 2, "roles": {
        "player_0": returns_int, "player_1": returns_int}}]}, max_steps=10, max_failed_steps=3)
    with pytest.raises(RunStopped, match=r"every episode of env 'kuhn_poker' failed in 3 consecutive steps.*"
                                         r"scripted policy must return str, got int"):
        trainer.train()
    assert trainer.state.global_step == 2  # steps 0-2 played, none trained on


class NoDeck(mrl.Env):
    """Fails before any seat plays: no trace, so no Parquet row."""

    name = "no_deck"
    roles = ("agent",)

    def sample_tasks(self, num, rng):
        return [mrl.Task(mrl.TaskData(prompt="Deal.")) for _ in range(num)]

    async def run(self, task, agents):
        raise RuntimeError("the deck is empty")


def test_episodes_that_fail_before_any_seat_plays_are_recorded_with_their_traceback(tmp_path, tiny):
    trainer = trainer_for(tmp_path, tiny, {"env": [{"id": "no_deck", "instance": NoDeck(), "group_size": 2}]},
                          max_steps=10, max_failed_steps=2, save_episodes=True)
    with pytest.raises(RunStopped, match=r"every episode of env 'no_deck' failed in 2 consecutive steps") as stopped:
        trainer.train()
    assert "traces/failed-rank{r}.jsonl" in str(stopped.value)  # where to look, as the message says
    records = list(read_records(tmp_path / "run" / "traces" / "failed-rank0.jsonl"))
    assert [r["step"] for r in records] == [0] * 8 + [1] * 8
    assert all(not r["ok"] and r["traces"] == [] and r["env"] == "no_deck" for r in records)
    assert all("RuntimeError: the deck is empty" in r["errors"][0] and "Traceback" in r["errors"][0]
               for r in records)
    # a resumed run forgets the steps it replays, as the shards do
    trainer.rollout.sink.resume(1)
    assert [r["step"] for r in read_records(tmp_path / "run" / "traces" / "failed-rank0.jsonl")] == [0] * 8


def test_a_stream_that_stays_empty_stops_the_run(tmp_path, tiny):
    # opsd needs a demonstration; these tasks have none, so its ref_kl stream never gets a token
    env = SingleAgentEnv(prompts(), reward=lambda task, trace: 0.0)
    trainer = trainer_for(tmp_path, tiny, {"algo": {"type": "opsd"}, "env": [{"id": "s", "instance": env,
                                                                               "group_size": 2}]},
                          max_steps=10, max_failed_steps=2)
    with pytest.raises(RunStopped, match=r"env 's': the ref_kl loss stream received no tokens in 2 consecutive steps"):
        trainer.train()


# -- item 5: wrong types, max_steps required ---------------------------------------------------------


@pytest.mark.parametrize("trainer, words", [
    ({"learning_rate": "1e-4"}, ["[trainer] learning_rate = '1e-4' (str)", "float"]),
    ({"max_steps": "1"}, ["[trainer] max_steps = '1' (str)", "int"]),
    ({"max_step": 3}, ["'max_step' is not a field", "did you mean 'max_steps'"]),
])
def test_trainer_fields_are_validated_at_load(trainer, words):
    with pytest.raises(pydantic.ValidationError) as info:
        ExperimentConfig.model_validate({"env": [{"id": "kuhn_poker"}], "trainer": trainer})
    for word in words:
        assert word in str(info.value), str(info.value)


def test_max_steps_is_required(tmp_path):
    with pytest.raises(ValueError, match=r"max_steps is required.*3 epochs"):
        MixedAlgorithmTrainer({"env": [{"id": "kuhn_poker"}], "trainer": {"output_dir": str(tmp_path)}})


# -- item 7: max_rl outside [0, 1] -------------------------------------------------------------------


def test_max_rl_refuses_rewards_outside_the_unit_interval(tmp_path, tiny):
    trainer = trainer_for(tmp_path, tiny, {"algo": {"type": "max_rl"}, "env": [{"id": "kuhn_poker", "group_size": 2,
                                           "args": {"legal_choices": True}}]}, max_steps=5, max_failed_steps=2)
    with pytest.raises(RunStopped, match=r"env 'kuhn_poker' failed .*role 'player_\d': max_rl needs rewards in "
                                         r"\[0, 1\], got -?\d.*affine rescaling"):
        trainer.train()
    # the Kuhn env's unit mapping (chips + 2) / 4 is what the recipe uses with max_rl
    trainer = trainer_for(tmp_path / "b", tiny, {"algo": {"type": "max_rl"}, "env": [{"id": "kuhn_poker", "group_size": 2,
                          "args": {"legal_choices": True, "reward": "unit"}}]}, max_steps=1)
    trainer.train()
    rewards = {t.reward for ep in trainer.rollout.last_episodes for t in ep.traces}
    assert all(ep.ok for ep in trainer.rollout.last_episodes) and rewards <= {0.0, 0.25, 0.75, 1.0}
    for ep in trainer.rollout.last_episodes:
        for t in ep.traces:
            assert t.reward == (t.info["chips"][int(t.role[-1])] + 2) / 4


# -- items 8 and 9: temperatures ------------------------------------------------------------------


def _save(model, tok, path) -> str:
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def _grads(trainer, batch):
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    trainer.model.zero_grad(set_to_none=True)
    trainer._compute_loss(trainer.model, batch).backward()
    grads = [p.grad.abs().max().item() for p in trainer.model.parameters() if p.grad is not None]
    trainer.model.zero_grad(set_to_none=True)
    return max(grads) if grads else 0.0


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.5])
@pytest.mark.parametrize("algo", ["opd", "opsd"])
def test_a_teacher_equal_to_the_student_gives_no_gradient_at_any_temperature(tmp_path, tiny, temperature, algo,
                                                                              monkeypatch):
    model, tok = tiny
    env = SingleAgentEnv([{"prompt": p["prompt"], "answer": "4"} for p in prompts()], reward=lambda t, tr: 0.0)
    if algo == "opd":
        config = {"type": "opd", "teacher": _save(model, tok, tmp_path / "same")}
    else:  # the live policy as its own teacher, with the hint removed: the teacher is exactly the student
        from multiagent_rl.algorithms.opsd import OPSD

        monkeypatch.setattr(OPSD, "hint_ids", lambda self, demonstration: [])
        config = {"type": "opsd", "teacher": "live"}
    trainer = trainer_for(tmp_path, tiny, {"algo": config, "env": [{"id": "s", "instance": env, "group_size": 4}]},
                          temperature=temperature, max_completion_length=6)
    torch.manual_seed(0)
    batch = trainer._generate_and_score_completions(None)
    assert batch["num_ref_kl_tokens"] > 0
    assert torch.allclose(batch["temperatures"][batch["action_mask"].bool()], torch.tensor(temperature))
    assert _grads(trainer, batch) < 1e-6


def test_a_policy_seat_with_its_own_temperature_is_trained_at_that_temperature(tmp_path, tiny):
    env = SingleAgentEnv(prompts(), reward=lambda task, trace: float(len(trace.last_reply)))
    trainer = trainer_for(tmp_path, tiny, {"env": [{"id": "s", "instance": env, "group_size": 4, "roles": {
        "agent": {"sampling": {"temperature": 0.5}}}}]}, max_completion_length=8)
    torch.manual_seed(0)
    batch = trainer._generate_and_score_completions(None)
    action = batch["action_mask"].bool()
    assert torch.all(batch["temperatures"][action] == 0.5)
    with torch.no_grad():
        logps = trainer.scorer.score(trainer.model, batch).logps
    diff = (logps - batch["sampling_logps"])[action].abs().max().item()
    assert diff < 1e-5, diff


# -- item 10: per-stream metrics under gradient accumulation ---------------------------------------


def _metric_episodes(make_trace, make_episode):
    rng = random.Random(7)

    def ids(n):
        return [rng.randrange(3, 500) for _ in range(n)]

    eps = []
    for k, r in enumerate([1.0, 0.0, 0.5, 0.5, 2.0, 1.0, 0.0, 1.0]):  # two groups of 4, with ties
        t = make_trace("agent", [("prompt", ids(3 + k)), ("action", ids(2 + k % 3))], r)
        eps.append(make_episode(f"e{k}", f"g{k // 4}", "single", [t]))
    for k in range(4):
        t = make_trace("player", [("prompt", ids(4)), ("action", ids(3 + k)), ("observation", ids(2)),
                                  ("action", ids(1 + k))], 0.0, model="scripted")
        eps.append(make_episode(f"sft{k}", f"h{k}", "imitate", [t]))
    return eps


def test_loss_metrics_do_not_depend_on_gradient_accumulation(tmp_path, tiny, make_trace, make_episode, feed):
    """The same generation batch, split into 1, 2 or 4 micro-batches: every logged loss metric is the same."""
    model, tok = tiny
    scripted = {"model": "scripted", "policy": lambda turn: "x", "algo": {"type": "sft"}}
    experiment = {"algo": {"type": "grpo"}, "env": [
        {"id": "single", "instance": SingleAgentEnv(prompts(), reward=lambda t, tr: 0.0), "group_size": 4},
        {"id": "imitate", "instance": SingleAgentEnv(prompts(), reward=lambda t, tr: 0.0, role="player"),
         "roles": {"player": scripted}},
    ]}
    logged = {}
    for gas in (1, 2, 4):
        trainer = MixedAlgorithmTrainer(
            experiment, args=args(tmp_path / str(gas), max_steps=1, gradient_accumulation_steps=gas,
                                  steps_per_generation=gas),
            model=copy.deepcopy(model), processing_class=tok)
        feed(trainer, lambda step: _metric_episodes(make_trace, make_episode))
        trainer.train()
        (log,) = [h for h in trainer.state.log_history if "loss" in h]
        logged[gas] = {k: v for k, v in log.items()
                       if k.startswith(("loss/", "ref_kl/", "clip_ratio/")) or k == "entropy"}
    assert {"loss/rl", "loss/ce", "loss/rl/grpo", "loss/ce/sft", "entropy"} <= set(logged[1])
    assert logged[1]["loss/ce"] > 1.0  # a real cross-entropy, not a share of it
    for gas in (2, 4):
        assert logged[gas].keys() == logged[1].keys()
        for k, v in logged[1].items():
            assert logged[gas][k] == pytest.approx(v, rel=1e-5, abs=1e-7), (gas, k)


# -- item 13: timeouts, blocking code, error text --------------------------------------------------


class Blocking(mrl.Env):
    name = "blocking_env"
    roles = ("agent",)

    async def run(self, task, agents):
        trace = await agents["agent"].run(task)
        time.sleep(0.3)  # blocks the event loop
        trace.add_reward("r", 1.0)


def test_code_that_blocks_the_event_loop_is_named_in_a_warning(caplog, monkeypatch):
    monkeypatch.setattr(env_module, "BLOCKING_WARNING_SECONDS", 0.2)
    agent = mrl.make_agent(mrl.AgentConfig(model="scripted", policy=lambda turn: "hi"))
    with caplog.at_level(logging.WARNING, logger="multiagent_rl.envs.base"):
        eps = run_sync(mrl.play_episodes(Blocking(), [mrl.Task(mrl.TaskData(prompt="x"))], {"agent": agent}))
    assert eps[0].ok
    assert "env 'blocking_env': run() ran 0.3 s without yielding to the event loop" in caplog.text
    assert "asyncio.to_thread" in caplog.text


def test_episode_errors_carry_no_unrelated_chained_context():
    class Boom(mrl.Env):
        roles = ("agent",)

        async def run(self, task, agents):
            raise RuntimeError("the env's own bug")

    agent = mrl.make_agent(mrl.AgentConfig(model="scripted", policy=lambda turn: "hi"))
    (ep,) = run_sync(mrl.play_episodes(Boom(), [mrl.Task(mrl.TaskData(prompt="x"))], {"agent": agent}))
    assert ep.errors[0].startswith("env 'env': RuntimeError: the env's own bug")
    assert "no running event loop" not in ep.errors[0] and "During handling" not in ep.errors[0]


def test_default_and_per_role_timeouts(tmp_path, tiny):
    import inspect

    assert inspect.signature(mrl.Env.play).parameters["timeout"].default == env_module.DEFAULT_EPISODE_TIMEOUT == 600
    assert inspect.signature(mrl.play_episodes).parameters["timeout"].default == 600

    async def hang(turn):
        await asyncio.sleep(3600)

    env = SingleAgentEnv(prompts(), reward=lambda t, tr: 0.0)
    trainer = trainer_for(tmp_path, tiny, {"env": [{"id": "hangs", "instance": env, "group_size": 2, "roles": {
        "agent": {"model": "scripted", "policy": hang, "algo": {"type": "sft"}, "timeout": 0.2}}}]},
        max_failed_steps=1)
    with pytest.raises(RunStopped, match=r"env 'hangs': ReplyTimeout: role 'agent' \(scripted\): no reply within 0.2 s"):
        trainer.train()
    hanging_env = SingleAgentEnv(prompts(), reward=lambda t, tr: 0.0)
    trainer = trainer_for(tmp_path / "b", tiny, {"env": [{"id": "slow", "instance": hanging_env, "group_size": 2,
                                                           "timeout": 0.3, "roles": {"agent": {
                                                               "model": "scripted", "policy": hang,
                                                               "algo": {"type": "sft"}}}}]}, max_failed_steps=1)
    with pytest.raises(RunStopped, match=r"env 'slow': episode timed out after 0.3 s, waiting for a reply from 'agent'"):
        trainer.train()


# -- item 14: limits and bad input -------------------------------------------------------------------


def test_a_prompt_longer_than_the_context_fails_its_episode(tmp_path, tiny):
    long = " ".join(["bet fold call check"] * 4600)  # ~18k tokens; the tiny model has 2,048 positions
    env = SingleAgentEnv([{"prompt": long}], reward=lambda t, tr: 0.0)
    trainer = trainer_for(tmp_path, tiny, {"algo": {"type": "rae"}, "env": [{"id": "long", "instance": env,
                                                                              "group_size": 1}]},
                          max_failed_steps=1, groups_per_step=1)
    with pytest.raises(RunStopped) as info:
        trainer.train()
    message = str(info.value)
    assert "env 'long': ValueError: prompt of " in message and "exceeds the context of model 'policy' (2048" in message

    # a scripted (imitated) reply can grow a trace past the context too: refused before training
    scripted = {"model": "scripted", "policy": lambda turn: long, "algo": {"type": "sft"}}
    env = SingleAgentEnv([{"prompt": "Say a lot."}], reward=lambda t, tr: 0.0)
    trainer = trainer_for(tmp_path / "b", tiny, {"env": [{"id": "long", "instance": env, "group_size": 1,
                                                           "roles": {"agent": scripted}}]},
                          max_failed_steps=1, groups_per_step=1, max_completion_length=4096)
    with pytest.raises(RunStopped, match=r"role 'agent': trace of \d+ tokens exceeds the policy's context of 2048"):
        trainer.train()


def test_a_model_id_that_cannot_be_found_says_what_was_tried(tmp_path):
    with pytest.raises(ModelNotFoundError, match=r"model 'Qwen/Qwen2.5-0.5B-Instructt' could not be loaded: no local "
                                                 r"folder.*not in the local cache and HF_HUB_OFFLINE is set"):
        load_model_and_tokenizer("Qwen/Qwen2.5-0.5B-Instructt")
    with pytest.raises(ModelNotFoundError, match=r"the local folder '.*missing' does not exist"):
        load_model_and_tokenizer(str(tmp_path / "missing"))
    with pytest.raises(ModelNotFoundError, match=r"model 'nope-model'"):
        mrl.make_agent(mrl.AgentConfig(model="nope-model"))


def test_text_that_cannot_be_encoded_is_a_clear_episode_error(backend):
    class Surrogate(mrl.Env):
        roles = ("agent",)

        async def run(self, task, agents):
            async with agents["agent"].interaction(task) as it:
                await it.send("a lone surrogate: \ud800")

    agent = mrl.Agent(mrl.AgentConfig(model="policy", sampling={"max_new_tokens": 2}), backend)
    (ep,) = run_sync(mrl.play_episodes(Surrogate(), [mrl.Task(mrl.TaskData(prompt="x"))], {"agent": agent}))
    assert not ep.ok
    assert "text cannot be encoded as UTF-8 (surrogates not allowed at position 18: '\\ud800')" in ep.errors[0]


# -- item 17: trace files ----------------------------------------------------------------------------


def test_episode_logs_are_strict_json_with_one_schema(tmp_path, tiny):
    def strict(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    runs = {
        "flaky": {"env": [{"id": "flaky", "instance": FlakyRewards(), "group_size": 5}]},
        "kuhn": {"algo": {"type": "rae"}, "env": [{"id": "kuhn_poker", "group_size": 2, "args": {"legal_choices": True}}]},
    }
    files = []
    for name, experiment in runs.items():
        trainer = trainer_for(tmp_path / name, tiny, experiment, save_episodes=True, episode_format="jsonl", max_steps=1)
        trainer.train()
        path = tmp_path / name / "run" / "episodes" / "rank0.jsonl"
        lines = path.read_text().splitlines()
        assert len(lines) == len(trainer.rollout.last_episodes)
        for line in lines:
            json.loads(line, parse_constant=strict)
        back = [ep for _, ep in read_episodes(path)]
        for ours, theirs in zip(trainer.rollout.last_episodes, back):
            assert [t.token_ids for t in ours.traces] == [t.token_ids for t in theirs.traces]
            assert [t.rewards for t in ours.traces if ours.ok] == [t.rewards for t in theirs.traces if theirs.ok]
            assert ours.errors == theirs.errors and ours.task.data.info == theirs.task.data.info
        files.append(str(path))
    nan_lines = [json.loads(line) for line in Path(files[0]).read_text().splitlines()]
    assert any(r["value"] is None for ep in nan_lines for t in ep["traces"] for r in t["rewards"])
    both = load_episode_logs(files)
    assert len(both) == sum(len(Path(f).read_text().splitlines()) for f in files)
    assert set(both["env"]) == {"flaky", "kuhn_poker"}
    kuhn = both.filter(lambda row: row["env"] == "kuhn_poker")
    assert kuhn[0]["traces"][0]["segments"][1]["allowed"][0]  # constrained choices kept their allowed ids


# -- item 18: the console --------------------------------------------------------------------------


def test_the_console_prints_one_readable_line_per_logging_step(tmp_path, tiny, capsys):
    trainer = trainer_for(tmp_path, tiny, {"algo": {"type": "rae"}, "env": [{"id": "kuhn_poker", "group_size": 2}]},
                          max_steps=3)
    trainer.train()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert len(lines) == 3
    assert lines[0].startswith("step 1/3  episodes 8  reward kuhn_poker player_0 ")
    assert "loss rl " in lines[0] and "{" not in "".join(lines)
    assert all(len(line) < 200 for line in lines)
    full = [h for h in trainer.state.log_history if "loss" in h][0]
    assert len(full) > 20  # the loggers still get every metric
