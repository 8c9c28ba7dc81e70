"""Sampler/trainer mismatch: the truncated importance-sampling correction and the weight sync hook."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from multiagent_rl.training import loss
from multiagent_rl.envs.base import SingleAgentEnv
from multiagent_rl.training.trainer import MixedAlgorithmTrainer


def test_importance_weights_follow_the_modes():
    trainer = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.3, 0.3, 0.3]]))
    sampler = torch.log(torch.tensor([[0.25, 0.4, 0.9], [0.3, 0.05, 0.3]]))
    sampled = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])  # token (0, 2) was not sampled by the policy
    token_ratio = torch.tensor([[2.0, 0.5, 1.0], [1.0, 6.0, 1.0]])
    w, stats = loss.importance_weights(trainer, sampler, sampled, "token_truncate", None, 3.0)
    torch.testing.assert_close(w, token_ratio.clamp(max=3.0))
    assert stats["clipped"].sum().item() == 1 and stats["ratio"].numel() == 5
    w, _ = loss.importance_weights(trainer, sampler, sampled, "token_mask", 0.6, 3.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.0, 1.0], [1.0, 0.0, 1.0]]))
    w, stats = loss.importance_weights(trainer, sampler, sampled, "sequence_truncate", None, 3.0)
    torch.testing.assert_close(w, torch.tensor([[1.0] * 3, [3.0] * 3]))  # products 1.0 and 6.0 (capped)
    w, _ = loss.importance_weights(trainer, sampler, sampled, "sequence_mask", None, 3.0)
    torch.testing.assert_close(w, torch.tensor([[1.0] * 3, [0.0] * 3]))
    with pytest.raises(ValueError, match="unknown importance sampling mode"):
        loss.importance_weights(trainer, sampler, sampled, "tokens", None, 3.0)


def _trainer(tmp_path, tiny, **kw):
    model, tok = tiny
    env = SingleAgentEnv([{"prompt": f"Count to {n}."} for n in range(6)],
                         reward=lambda task, trace: float(len(trace.last_reply) % 4))
    args_kw = dict(output_dir=str(tmp_path), report_to=[], save_strategy="no", save_episodes=False, logging_steps=1,
                   disable_tqdm=True, seed=0, max_completion_length=6, max_steps=3, learning_rate=1e-3,
                   groups_per_step=3)
    from multiagent_rl.training.trainer import MixedAlgorithmConfig

    experiment = {"algo": {"type": "grpo"}, "env": [{"id": "s", "instance": env, "group_size": 4}]}
    return MixedAlgorithmTrainer(experiment, args=MixedAlgorithmConfig(**{**args_kw, **kw}), model=copy.deepcopy(model),
                                 processing_class=tok)


def test_with_the_transformers_backend_the_ratio_is_one(tmp_path, tiny):
    trainer = _trainer(tmp_path, tiny)
    assert trainer.rollout.policy.exact_logprobs  # so the correction is off by default with it
    trainer.rollout.policy.exact_logprobs = False  # force the correction on: it must then be the identity
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 3
    for h in logs:
        assert abs(h["sampling/importance_sampling_ratio/mean"] - 1) < 1e-5
        assert abs(h["sampling/importance_sampling_ratio/max"] - 1) < 1e-5
        assert abs(h["sampling/importance_sampling_ratio/min"] - 1) < 1e-5
        assert h["sampling/importance_sampling_ratio/clipped"] == 0
        assert h["sampling/sampling_logp_difference/max"] < 1e-5


def test_a_mismatched_sampler_is_corrected_in_the_loss(tmp_path, tiny, loss_and_grads):
    """Sampling logprobs shifted by log 2 on every sampled token: weights exp(-log 2)... capped at the clip."""
    trainer = _trainer(tmp_path, tiny, vllm_importance_sampling_clip_max=1.5)
    trainer.rollout.policy.exact_logprobs = False
    torch.manual_seed(0)
    batch = trainer._generate_and_score_completions(None)
    sampled = batch["sampled_mask"].bool()
    assert sampled.any()
    shifted = dict(batch, sampling_logps=batch["sampling_logps"] - math.log(2.0))  # the sampler was half as likely
    w, _ = loss.importance_weights(shifted["old_per_token_logps"], shifted["sampling_logps"], shifted["sampled_mask"],
                                   "token_truncate", None, 1.5)
    torch.testing.assert_close(w[sampled], torch.full_like(w[sampled], 1.5))  # ratio 2, truncated at 1.5
    plain, _ = loss_and_grads(trainer, dict(batch, importance_weights=torch.ones_like(w)))
    weighted, _ = loss_and_grads(trainer, dict(batch, importance_weights=w))
    assert weighted.item() == pytest.approx(1.5 * plain.item(), rel=1e-5)


def test_weights_are_synced_once_per_optimizer_step_before_sampling(tmp_path, tiny):
    trainer = _trainer(tmp_path, tiny, gradient_accumulation_steps=2, steps_per_generation=2)
    calls = []
    original = trainer.rollout.policy.sync_weights
    trainer.rollout.policy.sync_weights = lambda model: (calls.append((trainer.state.global_step, model)),
                                                         original(model))
    trainer.train()
    assert [step for step, _ in calls] == [0, 1, 2]
    assert all(model is trainer.accelerator.unwrap_model(trainer.model) for _, model in calls)


def test_no_sampled_token_logs_no_sampler_figures():
    """A batch without a token the policy sampled (sft on demonstrations) has no importance ratio to report."""
    logps = torch.zeros(2, 3)
    _, stats = loss.importance_weights(logps, logps, torch.zeros(2, 3), "token_truncate", None, 3.0)
    assert loss.sampler_mismatch_metrics(stats, lambda t: t, lambda t: t) == {}

    # two processes, only the other sampled: its figures, untouched by this one's empty batch
    _, other = loss.importance_weights(torch.log(torch.tensor([[0.5, 0.2]])), torch.log(torch.tensor([[0.25, 0.4]])),
                                       torch.ones(1, 2), "token_truncate", None, 3.0)
    sent = {}  # what the other process puts into the reductions
    theirs = loss.sampler_mismatch_metrics(other, lambda t: sent.setdefault("sum", t.clone()),
                                           lambda t: sent.setdefault("max", t.clone()))
    figures = loss.sampler_mismatch_metrics(stats, lambda t: t + sent["sum"], lambda t: torch.maximum(t, sent["max"]))
    assert figures == pytest.approx(theirs)
    assert figures["sampling/importance_sampling_ratio/min"] == pytest.approx(0.5)
    assert figures["sampling/importance_sampling_ratio/max"] == pytest.approx(2.0)


def test_an_sft_warm_up_logs_no_importance_ratio_and_a_sampled_step_shows_it_on_the_console(tmp_path, tiny):
    from multiagent_rl.training.callbacks import console_line
    from multiagent_rl.training.trainer import MixedAlgorithmConfig

    model, tok = tiny
    scripted = {"model": "scripted", "policy": "multiagent_rl.envs.kuhn_poker:random_policy"}
    warm_up = MixedAlgorithmTrainer(
        {"algo": {"type": "sft"}, "env": [{"id": "kuhn_poker", "group_size": 2,
                                           "roles": {"player_0": scripted, "player_1": scripted}}]},
        args=MixedAlgorithmConfig(output_dir=str(tmp_path / "sft"), report_to=[], save_strategy="no",
                                  save_episodes=False, logging_steps=1, disable_tqdm=True, max_steps=2,
                                  groups_per_step=2),
        model=copy.deepcopy(model), processing_class=tok)
    warm_up.rollout.policy.exact_logprobs = False  # as with vLLM: the correction is on, but nothing was sampled
    warm_up.train()
    logs = [h for h in warm_up.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(h["loss/ce"] > 0 for h in logs)  # sft trained
    assert not [k for h in logs for k in h if k.startswith("sampling/")]
    assert "sampler" not in console_line(logs[-1], 2, 2)

    sampled = _trainer(tmp_path / "grpo", tiny, max_steps=1)
    sampled.rollout.policy.exact_logprobs = False
    sampled.train()
    (log,) = [h for h in sampled.state.log_history if "loss" in h]
    line = console_line(log, 1, 1)
    assert "sampler ratio 1 [1, 1]" in line and "logp gap max" in line, line
