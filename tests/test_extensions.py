"""Extending the library from outside it: a loss stream, an algorithm that writes it and a regulariser, each added in
one place from this file, train end to end, and reach the records, the Parquet schema, the metrics and the console."""

import math
import re

import pytest
import torch

from multiagent_rl.algorithms.base import ALGORITHMS, Algorithm, AlgorithmConfig, on_kind, register, trained_traces
from multiagent_rl.data.traces import load_traces
from multiagent_rl.envs.base import SingleAgentEnv
from multiagent_rl.episodes import streams
from multiagent_rl.episodes.trace import TokenStreams
from multiagent_rl.training.callbacks import console_line
from multiagent_rl.training.regularisers import REGULARISERS, Regulariser, RegulariserConfig, register_regulariser
from multiagent_rl.training.trainer import MixedAlgorithmTrainer


def bonus_loss(x):
    """A cross-entropy the size of its weights, on its own stream."""
    return -x.logps * x.batch["bonus_weights"]


class BonusConfig(AlgorithmConfig):
    type: str = "bonus_imitation"


class BonusImitation(Algorithm):
    config_class = BonusConfig
    loss_types = ("bonus",)
    uses_reward = False
    samples_from_policy = False  # it imitates a scripted player, as sft does

    def score_group(self, episodes, roles=None):
        for _, _, trace in trained_traces(episodes, roles):
            trace.streams = TokenStreams(self.name, bonus_weights=on_kind(trace, "action", 0.5))


class LogitPenaltyConfig(RegulariserConfig):
    type: str = "action_logp"
    coef: float = 0.1


class ActionLogp(Regulariser):
    """−c · Σ log π over the action tokens / their count: a term any user could write."""

    config_class = LogitPenaltyConfig

    def coef_at(self, step):
        return self.config.coef

    def term(self, step, scored, batch, normalizer, read_logits_of):
        action = batch["action_mask"] * batch["completion_mask"]
        value = -(scored.logps * action).sum() / normalizer(batch["num_action_tokens"])
        return self.config.coef * value, {"action_logp/mean": ((scored.logps.detach() * action).sum(),
                                                              batch["num_action_tokens"])}


@pytest.fixture
def extended():
    stream = streams.register_stream(streams.Stream("bonus", "bonus_weights", bonus_loss))
    register(BonusImitation)
    register_regulariser(ActionLogp)
    try:
        yield
    finally:
        streams.STREAMS.remove(stream)
        dict.pop(ALGORITHMS, "bonus_imitation")
        dict.pop(REGULARISERS, "action_logp")


def test_a_stream_an_algorithm_and_a_regulariser_added_here_train_end_to_end(tmp_path, extended):
    env = SingleAgentEnv([{"prompt": f"Say {w}."} for w in ("bet", "check", "fold")], reward=lambda t, tr: 1.0)
    trainer = MixedAlgorithmTrainer({
        "algo": {"type": "bonus_imitation"},
        "env": [{"id": "say", "instance": env, "group_size": 2,
                 "roles": {"agent": {"model": "scripted", "policy": lambda turn: "bet", "trainable": True}}}],
        "regulariser": [{"type": "action_logp", "coef": 0.2}],
        "trainer": {"output_dir": str(tmp_path / "run"), "max_steps": 2, "report_to": [], "save_strategy": "no",
                    "logging_steps": 1, "seed": 0, "max_completion_length": 4, "learning_rate": 1e-2},
    })
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(math.isfinite(h["loss/bonus"]) and h["loss/bonus"] > 0 for h in logs)
    assert all("action_logp/mean" in h and h["action_logp/mean"] < 0 for h in logs)
    assert re.search(r"loss .*bonus [0-9.]+", console_line(logs[-1], 2, 2))
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    traces = load_traces(tmp_path / "run" / "traces")
    weights = [w for row in traces for w in (row["streams"]["bonus_weights"] or [])]
    assert "bonus_weights" in traces.features["streams"] and set(weights) == {0.0, 0.5}


def test_a_stream_cannot_take_a_name_or_field_already_used():
    with pytest.raises(ValueError, match=r"\['advantages'\] already used"):
        streams.register_stream(streams.Stream("rl2", "advantages", bonus_loss))
    with pytest.raises(TypeError, match="TokenStreams has no field"):
        TokenStreams("x", bonus_weights=[1.0])
