"""MixedAlgorithmTrainer against oracles.

- GRPO parity: with every sample tagged ``grpo`` the loss and gradients equal TRL's own
  ``GRPOTrainer._compute_loss`` (DAPO, beta 0) on the same inputs, also under gradient accumulation.
- Cross-entropy: an all-SFT batch's loss is the mean token cross-entropy computed directly.
- ECHO: collated streams from played episodes; observation tokens never enter the rl normaliser.
- OPD: a teacher equal to the student gives zero gradient; a different teacher is approached.
- A three-algorithm, two-environment run; config errors; RAE state in checkpoints; two processes.
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pydantic
import pytest
import torch
from datasets import Dataset
from trl import GRPOConfig as TRLGRPOConfig
from trl import GRPOTrainer
from trl.trainer.utils import split_tensor_dict

from multiagent_rl.agents.agent import Agent, AgentConfig
from multiagent_rl.algorithms import build_algorithm
from multiagent_rl.backends import SamplingParams, build_backend
from multiagent_rl.training.collate import collate, trainable_samples
from multiagent_rl.config import ExperimentConfig
from multiagent_rl.envs.base import SingleAgentEnv, play_episodes, run_sync
from multiagent_rl.envs.kuhn_poker import KuhnPokerEnv, random_policy
from multiagent_rl.models import build_tiny_model
from multiagent_rl.tasks.task import Task, TaskData
from multiagent_rl.training.checkpoint import ALGORITHM_STATE_FILE
from multiagent_rl.training.trainer import MixedAlgorithmTrainer


HERE = Path(__file__).parent
VOCAB = 500  # random token ids stay below the tiny tokenizer's size (622) and above its 3 special tokens


# -- helpers ----------------------------------------------------------------------------------


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """One intra-op thread: the tiny model gains nothing from two, and two threads on a busy
    2-core machine run ~10x slower (measured: the OPD learning test took 19 s with one, 235 s with two)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, VOCAB) for _ in range(n)]


def single_env(role: str = "agent", reward=None) -> SingleAgentEnv:
    prompts = [f"What is {a} + {b}?" for a in range(4) for b in range(2)]
    return SingleAgentEnv([{"prompt": p} for p in prompts], reward=reward or (lambda task, trace: 0.0), role=role)


@torch.no_grad()
def token_logps(model, token_ids: list[int]) -> list[float | None]:
    """log p(t_j | t_<j) for every position of one unpadded sequence (None at 0), plain forward pass."""
    logits = model(torch.tensor([token_ids])).logits[0].float()
    logp = torch.log_softmax(logits[:-1], dim=-1).gather(-1, torch.tensor(token_ids[1:]).unsqueeze(-1)).squeeze(-1)
    return [None, *logp.tolist()]


def trained_rows(episodes):
    """(trace, env) per collated sample, in the collator's order."""
    return [(s.trace, s.env) for s in trainable_samples(episodes)]


# -- 1. GRPO parity with TRL --------------------------------------------------------------------


def _grpo_episodes(make_trace, make_episode, rewards=(1.0, 0.0, 0.5, 2.0)):  # default: mean 0.875, no sample has a zero advantage
    rng = random.Random(0)
    return [
        make_episode(f"e{k}", "g0", "single",
                     [make_trace("agent", [("prompt", ids(rng, 3 + 2 * k)), ("action", ids(rng, 6 - k))], r)])
        for k, r in enumerate(rewards)
    ]


def _trl_trainer(tmp_path, tiny, accumulation: int, steps_per_generation: int) -> GRPOTrainer:
    model, tok = tiny

    def unused_reward(completions, **kwargs):
        return [0.0] * len(completions)

    args = TRLGRPOConfig(
        output_dir=str(tmp_path / "trl"), use_cpu=True, bf16=False, gradient_checkpointing=False,
        beta=0.0, loss_type="dapo", scale_rewards="none", per_device_train_batch_size=2, num_generations=2,
        gradient_accumulation_steps=accumulation, steps_per_generation=steps_per_generation, max_completion_length=8,
        report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True,
    )
    return GRPOTrainer(model=copy.deepcopy(model), reward_funcs=unused_reward, args=args,
                       train_dataset=Dataset.from_dict({"prompt": ["x"] * 8}), processing_class=tok)


REWARD_SETS = {"distinct": (1.0, 0.0, 0.5, 2.0), "ties": (1.0, 0.0, 0.5, 0.5), "all_equal": (1.0, 1.0, 1.0, 1.0)}


@pytest.mark.parametrize("reward_set", list(REWARD_SETS))
@pytest.mark.parametrize("accumulation, steps_per_generation", [(1, 1), (2, 2), (1, 2)])
def test_all_grpo_loss_and_gradients_equal_trl(tmp_path, tiny, accumulation, steps_per_generation, reward_set, make_trace, make_episode, fixed_trainer, loss_and_grads, grad_checks):
    """Per micro-batch, on-policy (ratio 1) and off-policy (clipped ratios), loss and gradients equal TRL's,
    for any rewards: zero-advantage samples (ties, an all-equal group) count in the rl token count as in TRL."""
    max_grad, max_grad_diff = grad_checks
    experiment = {"algo": {"type": "grpo"}, "env": [{"id": "single", "instance": single_env(), "group_size": 4}]}
    episodes = _grpo_episodes(make_trace, make_episode, REWARD_SETS[reward_set])
    rewards = torch.tensor([ep.traces[0].reward for ep in episodes])
    expected_adv = rewards - rewards.mean()

    mixed = fixed_trainer(tmp_path / "mixed", tiny, experiment, episodes,
                          gradient_accumulation_steps=accumulation, steps_per_generation=steps_per_generation)
    trl = _trl_trainer(tmp_path, tiny, accumulation, steps_per_generation)
    batch = mixed._generate_and_score_completions(None)
    assert batch["algorithm"] == ["grpo"] * 4
    assert torch.equal(batch["rl_mask"], batch["completion_mask"].float())  # every completion token is an action
    torch.testing.assert_close(batch["advantages"], expected_adv[:, None] * batch["completion_mask"])
    trl_batch = {k: batch[k] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
    trl_batch["advantages"] = expected_adv.clone()
    trl_batch["num_items_in_batch"] = batch["completion_mask"].sum()
    assert batch["num_rl_tokens"].item() == trl_batch["num_items_in_batch"].item()
    # Several optimizer steps per generation: the sampling policy's logprobs are frozen in the batch.
    assert ("old_per_token_logps" in batch) == (steps_per_generation > accumulation)
    if "old_per_token_logps" in batch:
        trl_batch["old_per_token_logps"] = batch["old_per_token_logps"]

    # Off-policy copy: old logprobs shifted by up to ±0.5 so that some ratios fall outside [0.8, 1.2].
    noise = (torch.rand(batch["completion_ids"].shape, generator=torch.Generator().manual_seed(0)) - 0.5)
    with torch.no_grad():
        current = mixed._get_per_token_logps_and_entropies(
            mixed.model, torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1),
            torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1), batch["completion_ids"].size(1))[0]
    old = current + noise
    ratio = torch.exp(noise.neg())[batch["completion_mask"].bool()]
    assert ((ratio < 0.8) | (ratio > 1.2)).any() and ((ratio > 0.8) & (ratio < 1.2)).any()

    sums = {}
    for name, m_batch, t_batch in (
        ("on", batch, trl_batch),
        ("off", dict(batch, old_per_token_logps=old), dict(trl_batch, old_per_token_logps=old)),
    ):
        losses, grads = [], []
        for m_in, t_in in zip(split_tensor_dict(m_batch, steps_per_generation),
                              split_tensor_dict(t_batch, steps_per_generation)):
            m_loss, m_grads = loss_and_grads(mixed, m_in, accumulation)
            t_loss, t_grads = loss_and_grads(trl, t_in, accumulation)
            assert abs(m_loss.item() - t_loss.item()) < 1e-6, (name, m_loss, t_loss)
            if t_in["advantages"].abs().sum() > 0:
                assert max_grad(t_grads) > 1e-3  # a real gradient, not two zeros
            assert max_grad_diff(m_grads, t_grads) < 1e-6, name
            losses.append(m_loss)
            grads.append(m_grads)
        sums[name] = (sum(losses), {n: sum(g[n] for g in grads) for n in grads[0]})

    # On-policy (ratio 1) the micro-batch losses add up to (steps_per_generation / accumulation) x the
    # whole generation batch's DAPO loss −Σ A / N over its N tokens.
    mask = batch["completion_mask"].float()
    whole = (-(expected_adv[:, None] * mask).sum() / mask.sum()).item()
    assert abs(sums["on"][0].item() - whole * steps_per_generation / accumulation) < 1e-6


def test_skip_zero_advantage_scales_the_rl_step_by_the_share_of_nonzero_tokens(tmp_path, tiny, make_trace, make_episode, fixed_trainer, loss_and_grads):
    """The documented option: zero-advantage samples leave the rl token count, so loss and gradient are TRL's
    × N_all / N_nonzero."""
    experiment = {"algo": {"type": "grpo"}, "env": [{"id": "single", "instance": single_env(), "group_size": 4}]}
    episodes = _grpo_episodes(make_trace, make_episode, REWARD_SETS["ties"])
    counted = fixed_trainer(tmp_path / "a", tiny, experiment, episodes)
    skipped = fixed_trainer(tmp_path / "b", tiny, experiment, episodes, skip_zero_advantage=True)
    batch_all = counted._generate_and_score_completions(None)
    batch_nonzero = skipped._generate_and_score_completions(None)
    n_all, n_nonzero = batch_all["num_rl_tokens"].item(), batch_nonzero["num_rl_tokens"].item()
    assert n_nonzero < n_all
    loss_all, grads_all = loss_and_grads(counted, batch_all)
    loss_nonzero, grads_nonzero = loss_and_grads(skipped, batch_nonzero)
    assert loss_nonzero.item() == pytest.approx(loss_all.item() * n_all / n_nonzero, rel=1e-5)
    for n in grads_all:
        torch.testing.assert_close(grads_nonzero[n], grads_all[n] * n_all / n_nonzero, rtol=1e-4, atol=1e-7)


# -- 2. cross-entropy stream --------------------------------------------------------------------


def test_all_sft_loss_is_mean_token_cross_entropy(tmp_path, tiny, make_trace, make_episode, fixed_trainer, loss_and_grads, grad_checks):
    max_grad, max_grad_diff = grad_checks
    rng = random.Random(1)
    scripted = {"model": "scripted", "policy": lambda turn: "yes", "trainable": True}
    experiment = {"algo": {"type": "sft"},
                  "env": [{"id": "single", "instance": single_env(), "roles": {"agent": scripted}}]}
    episodes = [
        make_episode(f"e{k}", f"g{k}", "single", [make_trace(
            "agent",
            [("prompt", ids(rng, 4 + k)), ("action", ids(rng, 2 + k)), ("observation", ids(rng, 3)),
             ("action", ids(rng, 1 + 2 * k))],
            0.0,
        )])
        for k in range(3)
    ]
    trainer = fixed_trainer(tmp_path, tiny, experiment, episodes, per_device_train_batch_size=3, num_generations=3)
    batch = trainer._generate_and_score_completions(None)
    assert batch["algorithm"] == ["sft"] * 3
    assert not batch["rl_mask"].any() and not batch["ref_kl_weights"].any()

    model = tiny[0]
    nll = []
    for ep in episodes:
        t = ep.traces[0]
        logps = token_logps(model, t.token_ids)
        nll += [-lp for lp, kind in zip(logps, t.token_kinds) if kind == "action"]
    assert batch["num_ce_tokens"].item() == len(nll)

    loss, grads = loss_and_grads(trainer, batch)
    assert abs(loss.item() - sum(nll) / len(nll)) < 1e-6
    assert max_grad(grads) > 1e-3
    metrics = trainer._metrics["train"]
    assert metrics["loss/ce/sft"][-1] == pytest.approx(sum(nll) / len(nll), abs=1e-6)
    assert metrics["loss/rl"][-1] == 0 and metrics["loss/ref_kl"][-1] == 0


# -- 3. ECHO --------------------------------------------------------------------------------------


def test_echo_streams_from_played_kuhn_episodes(backend, tiny):
    """Played multi-turn episodes, ECHO-scored, collated: α on observations after the first action, A on actions."""
    _, tok = tiny
    agent = Agent(AgentConfig(model="policy"), backend)
    torch.manual_seed(0)
    task = Task(TaskData(info={"cards": ["J", "K"]}))
    episodes = run_sync(play_episodes(KuhnPokerEnv(), [task], {"player_0": agent, "player_1": agent}, group_size=4,
                                      trainable={"player_0": True, "player_1": True}))
    for k, ep in enumerate(episodes):
        ep.env = "kuhn_poker"
        for t in ep.traces:
            t.add_reward("spread", float(k))  # distinct rewards in the group: nonzero advantages
    alpha = {"player_0": 0.25, "player_1": 0.5}
    build_algorithm({"type": "echo", "alpha": 0.25, "role_alpha": {"player_1": 0.5}}).score_group(episodes)
    batch = collate(trainable_samples(episodes), tok.pad_token_id)

    rewards = {role: [t.reward for ep in episodes for t in ep.traces if t.role == role] for role in alpha}
    rows = trained_rows(episodes)
    assert len(rows) == batch["completion_ids"].shape[0] > 0
    ce_tokens = 0
    for i, (trace, _) in enumerate(rows):
        p = trace.prompt_length
        kinds = trace.token_kinds[p:]
        c = len(kinds)
        assert batch["completion_ids"][i, :c].tolist() == trace.token_ids[p:]
        assert batch["completion_mask"][i].tolist() == [1] * c + [0] * (batch["completion_mask"].shape[1] - c)
        advantage = trace.reward - sum(rewards[trace.role]) / len(rewards[trace.role])
        acted = False
        for j, kind in enumerate(kinds):
            acted = acted or kind == "action"
            assert batch["action_mask"][i, j].item() == float(kind == "action")
            want_ce = alpha[trace.role] if (acted and kind == "observation") else 0.0
            assert batch["ce_weights"][i, j].item() == pytest.approx(want_ce)
            want_rl = advantage if kind == "action" else 0.0
            assert batch["advantages"][i, j].item() == pytest.approx(want_rl, abs=1e-6)
            assert batch["rl_mask"][i, j].item() == float(kind == "action" and advantage != 0)
            ce_tokens += want_ce != 0
        sampled = [lp for lp, kind in zip(trace.sampling_logprobs[p:], kinds) if kind == "action"]
        torch.testing.assert_close(batch["sampling_logps"][i][batch["action_mask"][i].bool()], torch.tensor(sampled))
        assert batch["ref_kl_weights"][i].abs().sum() == 0
    assert ce_tokens > 0 and batch["rl_mask"].sum() > 0  # the random model's invalid replies were re-prompted


def _echo_episodes(make_trace, make_episode, extra_tail: int):
    """ECHO traces ending in an observation after the last action; ``extra_tail`` lengthens only that tail."""
    rng = random.Random(2)
    episodes = []
    for k, reward in enumerate([1.0, -1.0, 0.5]):
        segments = [("prompt", ids(rng, 4 + k)), ("action", ids(rng, 2 + k)), ("observation", ids(rng, 3)),
                    ("action", ids(rng, 2)), ("observation", ids(rng, 2 + k))]
        tail = random.Random(100 + k)
        segments[-1] = ("observation", segments[-1][1] + ids(tail, extra_tail))
        episodes.append(make_episode(f"e{k}", "g0", "single", [make_trace("agent", segments, reward)]))
    return episodes


def test_echo_observations_do_not_dilute_rl_gradient(tmp_path, tiny, make_trace, make_episode, fixed_trainer, loss_and_grads, grad_checks):
    """Doubling the observation tokens leaves the rl loss and gradient unchanged (ce has its own normaliser)."""
    max_grad, max_grad_diff = grad_checks
    experiment = {"algo": {"type": "echo", "alpha": 0.5},
                  "env": [{"id": "single", "instance": single_env(), "group_size": 3}]}
    current = {}
    trainer = fixed_trainer(tmp_path, tiny, experiment, lambda step: copy.deepcopy(current["episodes"]),
                            per_device_train_batch_size=3, num_generations=3)
    model = tiny[0]
    results = {}
    for name, extra in (("base", 0), ("doubled", 8)):
        current["episodes"] = _echo_episodes(make_trace, make_episode, extra)
        batch = trainer._generate_and_score_completions(None)
        n_obs = sum(kind == "observation" for ep in current["episodes"] for kind in ep.traces[0].token_kinds)
        assert batch["num_ce_tokens"].item() == n_obs  # every observation comes after the first action
        assert batch["num_rl_tokens"].item() == batch["action_mask"].sum().item()
        full_loss, _ = loss_and_grads(trainer, batch)
        rl_only = dict(batch, ce_weights=torch.zeros_like(batch["ce_weights"]))  # counts stay as collated
        rl_loss, rl_grads = loss_and_grads(trainer, rl_only)
        # The ce part is Σ α·(−log p) over observation tokens divided by their count.
        ce = [0.5 * -lp for ep in current["episodes"] for lp, kind in
              zip(token_logps(model, ep.traces[0].token_ids), ep.traces[0].token_kinds) if kind == "observation"]
        assert abs((full_loss - rl_loss).item() - sum(ce) / len(ce)) < 1e-6
        results[name] = (batch["num_ce_tokens"].item(), batch["num_rl_tokens"].item(), rl_loss, rl_grads)

    (ce_a, rl_a, loss_a, grads_a), (ce_b, rl_b, loss_b, grads_b) = results["base"], results["doubled"]
    assert ce_b >= 2 * ce_a and rl_a == rl_b
    assert max_grad(grads_a) > 1e-3
    assert abs(loss_a.item() - loss_b.item()) < 1e-6
    assert max_grad_diff(grads_a, grads_b) < 1e-6


# -- 4. OPD ---------------------------------------------------------------------------------------


def _save(model, tok, path) -> str:
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def _opd_trainer(tmp_path, tiny, mixed_args, teacher_path, **kw):
    model, tok = tiny
    experiment = {"algo": {"type": "opd", "teacher": teacher_path},
                  "env": [{"id": "single", "instance": single_env(), "group_size": kw.pop("group_size", 4)}]}
    return MixedAlgorithmTrainer(experiment, args=mixed_args(tmp_path / "run", **kw), model=copy.deepcopy(model),
                                 processing_class=tok)


def test_opd_teacher_equal_to_student_gives_zero_gradient(tmp_path, tiny, mixed_args, loss_and_grads, grad_checks):
    max_grad, max_grad_diff = grad_checks
    model, tok = tiny
    same = _save(model, tok, tmp_path / "same")
    other_model = build_tiny_model(len(tok), seed=1)
    other = _save(other_model, tok, tmp_path / "other")
    grads = {}
    for name, path in (("same", same), ("other", other)):
        trainer = _opd_trainer(tmp_path / name, tiny, mixed_args, path, groups_per_step=2, max_completion_length=4)
        torch.manual_seed(0)
        batch = trainer._generate_and_score_completions(None)  # played with the policy, scored by the teacher
        assert set(batch["algorithm"]) == {"opd"}
        assert batch["num_ref_kl_tokens"].item() == batch["action_mask"].sum().item() > 0
        assert torch.equal(batch["ref_kl_weights"], batch["action_mask"])
        assert batch["num_rl_tokens"].item() == 0 and batch["num_ce_tokens"].item() == 0
        if name == "same":  # the teacher's logprobs are the policy's own
            live = trainer._get_per_token_logps_and_entropies(
                trainer.model, torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1),
                torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1), batch["completion_ids"].size(1))[0]
            w = batch["ref_kl_weights"].bool()
            torch.testing.assert_close(batch["ref_logprobs"][w], live.detach()[w], atol=1e-5, rtol=0)
        _, grads[name] = loss_and_grads(trainer, batch)
    assert max_grad(grads["same"]) < 1e-5
    assert max_grad(grads["other"]) > 1e-2


@torch.no_grad()
def _reverse_kl(policy, teacher, backend, prompts, seed):
    """On fresh policy samples: (sampled-token estimate of E[log π − log π_T], exact per-position reverse KL).

    One padded forward pass per model; positions are the sampled completion tokens.
    """
    gens = backend.generate_batch(prompts, SamplingParams(max_new_tokens=4, seed=seed))
    seqs = [p + g.token_ids for p, g in zip(prompts, gens)]
    width = max(map(len, seqs))
    input_ids = torch.zeros((len(seqs), width), dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    scored = torch.zeros_like(input_ids, dtype=torch.bool)  # positions whose next token was sampled
    for i, (p, s) in enumerate(zip(prompts, seqs)):
        input_ids[i, : len(s)] = torch.tensor(s)
        attention_mask[i, : len(s)] = 1
        scored[i, len(p) - 1 : len(s) - 1] = True
    lp = torch.log_softmax(policy(input_ids=input_ids, attention_mask=attention_mask).logits.float(), -1)[scored]
    lt = torch.log_softmax(teacher(input_ids=input_ids, attention_mask=attention_mask).logits.float(), -1)[scored]
    tokens = input_ids.roll(-1, dims=1)[scored]
    sampled = (lp - lt).gather(-1, tokens[:, None]).squeeze(-1)
    exact = (lp.exp() * (lp - lt)).sum(-1)
    return sampled.mean().item(), exact.mean().item()


def test_opd_training_lowers_reverse_kl_to_a_different_teacher(tmp_path, tiny, mixed_args):
    _, tok = tiny
    teacher = build_tiny_model(len(tok), seed=1)
    with torch.no_grad():  # a sharper teacher than the near-uniform random student, so there is a gap to close
        teacher.model.norm.weight.mul_(3.0)
    path = _save(teacher, tok, tmp_path / "teacher")
    trainer = _opd_trainer(tmp_path, tiny, mixed_args, path, group_size=8, groups_per_step=8, max_steps=15, learning_rate=2e-3,
                           lr_scheduler_type="constant", max_completion_length=4)
    teacher = build_backend(path, device=trainer.accelerator.device).model  # the cached copy the trainer scores with
    policy = trainer.model
    held_out = [tok.apply_chat_template([{"role": "user", "content": f"Say {w}."}], tokenize=True,
                                        add_generation_prompt=True) for w in ("yes", "no", "hello", "goodbye")]
    held_out = [list(h["input_ids"] if isinstance(h, dict) or hasattr(h, "keys") else h) for h in held_out] * 128

    def measure():
        policy.eval()
        # 8 x 512 samples: the sampled-token estimate's spread is ~0.005 here, the exact one's ~0.0002
        runs = [_reverse_kl(policy, teacher, trainer.rollout.policy, held_out, seed) for seed in range(11, 19)]
        return sum(r[0] for r in runs) / len(runs), sum(r[1] for r in runs) / len(runs)

    torch.manual_seed(0)
    sampled_before, exact_before = measure()
    trainer.train()
    sampled_after, exact_after = measure()
    logged = [h["ref_kl/sampled_reverse_kl"] for h in trainer.state.log_history if "ref_kl/sampled_reverse_kl" in h]
    assert len(logged) == 15
    # measured (tiny v2): sampled 0.141 -> 0.119, exact 0.140 -> 0.117; one seed's sampled estimate spreads ~0.013
    print(f"reverse KL to the teacher: sampled {sampled_before:.4f} -> {sampled_after:.4f}, "
          f"exact {exact_before:.4f} -> {exact_after:.4f}")
    assert sampled_after < sampled_before, (sampled_before, sampled_after)
    assert exact_after < 0.92 * exact_before, (exact_before, exact_after)


# -- 5. three algorithms, two environments ---------------------------------------------------------


def test_three_algorithms_two_environments_train(tmp_path, tiny, mixed_args):
    def varied(task, trace):
        return float(sum(t for s in trace.segments if s.kind == "action" for t in s.token_ids) % 5)

    experiment = {
        "algo": {"type": "grpo"},
        "env": [
            {"id": "kuhn_poker", "group_size": 2, "roles": {
                # a scripted dealer-side player the policy imitates, and the policy's seat under RAE
                "player_0": {"model": "scripted", "policy": random_policy(), "trainable": True,
                             "algo": {"type": "sft"}},
                "player_1": {"algo": {"type": "rae"}},
            }},
            {"id": "single", "instance": single_env(reward=varied), "group_size": 4},
        ],
    }
    model, tok = tiny
    policy = copy.deepcopy(model)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    trainer = MixedAlgorithmTrainer(experiment, args=mixed_args(tmp_path / "run", max_steps=3, groups_per_step=3,
                                                                learning_rate=1e-3, max_completion_length=4),
                                    model=policy, processing_class=tok)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 3
    keys = {k for h in logs for k in h}
    for key in ("loss/rl/rae", "loss/rl/grpo", "loss/ce/sft"):
        assert key in keys, sorted(keys)
    assert any(h.get("loss/ce/sft", 0) > 0 for h in logs)
    assert any(h.get("loss/rl/rae", 0) != 0 for h in logs)
    assert any(h.get("single/agent/grpo/tokens_rl", 0) > 0 for h in logs)
    assert any(h.get("kuhn_poker/player_0/sft/tokens_ce", 0) > 0 for h in logs)
    assert all(math.isfinite(h["loss"]) for h in logs)
    changed = [n for n, p in policy.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert len(changed) == len(before)


# -- 6. configuration errors -----------------------------------------------------------------------


def _error(exc_info) -> str:
    return str(exc_info.value)


@pytest.mark.parametrize(
    "config, words",
    [
        ({"env": [{"id": "kuhn_poker"}], "algorithm": {"type": "grpo"}}, ["algorithm", "Extra inputs"]),
        ({"env": [{"id": "kuhn_poker", "group": 4}]}, ["group", "Extra inputs"]),
        ({"env": [{"id": "kuhn_poker"}], "algo": {"type": "grpo", "scale_reward": True}}, ["scale_reward"]),
        ({"env": [{"id": "kuhn_poker", "roles": {"player_0": {"trainble": False}}}]}, ["trainble"]),
        ({"env": [{"id": "kuhn_poker"}], "model": {"nme": "tiny"}}, ["nme"]),
        ({"env": [{"id": "kuhn_poker"}], "algo": {"type": "ppo"}}, ["ppo", "known types", "grpo"]),
        ({"env": [{"id": "kuhn_poker"}], "algo": {"type": "opd"}}, ["teacher", "Field required"]),
        ({"env": [{"id": "kuhn"}]}, ["unknown env id 'kuhn'", "kuhn_poker"]),
        ({"env": []}, ["at least one [[env]]"]),
        ({"env": [{"id": "kuhn_poker", "roles": {"player_0": {"algo": {"type": "sft"}}}}]},
         ["player_0", "'sft'", "frozen model or scripted policy"]),
        ({"env": [{"id": "kuhn_poker"}], "algo": {"type": "sft"}}, ["'sft'", "[env.roles.NAME]"]),
        ({"env": [{"id": "kuhn_poker", "roles": {"player_0": {
            "model": "scripted", "policy": "multiagent_rl.envs.kuhn_poker:random_policy", "trainable": True}}}]},
         ["player_0", "'grpo'", "scripted", "trainable = false", "'sft'"]),
        ({"env": [{"id": "kuhn_poker", "roles": {"player_0": {"model": "scripted"}}}]}, ["needs `policy`"]),
        ({"env": [{"id": "kuhn_poker", "stop_step": 0}]}, ["stop_step"]),
    ],
)
def test_config_errors_name_the_key_and_the_fix(config, words):
    with pytest.raises((ValueError, pydantic.ValidationError)) as exc_info:
        ExperimentConfig.model_validate(config)
    for word in words:
        assert word in _error(exc_info), (word, _error(exc_info))


def test_trainer_build_errors(tmp_path, tiny, mixed_args):
    model, tok = tiny
    scripted = {"model": "scripted", "policy": random_policy(), "trainable": True}
    cases = [
        # a seat the env does not have
        ({"env": [{"id": "kuhn_poker", "roles": {"player_2": {"trainable": False}}}]},
         ["player_2", "player_0", "player_1"]),
        # sft as the default while the other seat (unlisted) plays the policy
        ({"algo": {"type": "sft"}, "env": [{"id": "kuhn_poker", "roles": {"player_0": scripted}}]},
         ["player_1", "'sft'", "[env.roles.player_1]"]),
    ]
    for config, words in cases:
        with pytest.raises(ValueError) as exc_info:
            MixedAlgorithmTrainer(config, args=mixed_args(tmp_path / "run"), model=copy.deepcopy(model), processing_class=tok)
        for word in words:
            assert word in _error(exc_info), (word, _error(exc_info))
    with pytest.raises(ValueError, match="opd"):
        mixed_args(tmp_path / "run", beta=0.1)
    with pytest.raises(ValueError, match="processing_class"):
        MixedAlgorithmTrainer({"env": [{"id": "kuhn_poker"}]}, args=mixed_args(tmp_path / "run"), model=copy.deepcopy(model))


def test_toml_config_builds_a_trainer(tmp_path):
    out = tmp_path / "out"
    path = tmp_path / "exp.toml"
    path.write_text(f"""
[algo]
type = "rae"
decay = 0.9

[model]
name = "tiny"

[[env]]
id = "kuhn_poker"
group_size = 2
weight = 2.0

[env.roles.player_1]
model = "scripted"
policy = "multiagent_rl.envs.kuhn_poker:random_policy"
trainable = false

[[env]]
id = "kuhn_poker"
name = "kuhn_echo"
algo = {{ type = "echo", alpha = 0.2 }}

[trainer]
output_dir = "{out}"
max_steps = 1
report_to = []
save_strategy = "no"
learning_rate = 1e-3
""")
    exp = ExperimentConfig.from_toml(path)
    assert exp.algo.type == "rae" and exp.algo.decay == 0.9
    assert exp.env[0].group_size == 2 and exp.env[0].weight == 2.0
    assert exp.seat_trainable(exp.env[0], "player_1") is False
    assert exp.algorithm_for(exp.env[1], "player_0").alpha == 0.2
    trainer = MixedAlgorithmTrainer(exp)
    assert trainer.args.max_steps == 1 and trainer.args.learning_rate == 1e-3 and trainer.args.output_dir == str(out)
    assert [slot.label for slot in trainer.rollout.slots] == ["kuhn_poker", "kuhn_echo"]
    assert sorted(a.name for a in trainer.rollout.algorithms.values()) == ["echo", "rae"]
    assert trainer.rollout.slots[0].trainable == {"player_0": True, "player_1": False}

    bad = tmp_path / "bad.toml"
    bad.write_text('[[env]]\nid = "kuhn_poker"\ngroup_sise = 4\n')
    with pytest.raises(pydantic.ValidationError, match="group_sise"):
        ExperimentConfig.from_toml(bad)


# -- 7. RAE state in checkpoints ---------------------------------------------------------------------


def test_rae_baselines_are_saved_and_restored(tmp_path, tiny, mixed_args):
    model, tok = tiny
    experiment = {"algo": {"type": "rae"}, "env": [{"id": "kuhn_poker", "group_size": 2, "roles": {
        "player_1": {"model": "scripted", "policy": random_policy(), "trainable": False}}}]}
    out = tmp_path / "ckpt"

    def make(max_steps):
        args = mixed_args(out, max_steps=max_steps, save_strategy="steps", save_steps=2,
                          groups_per_step=2, max_completion_length=4)
        return MixedAlgorithmTrainer(experiment, args=args, model=copy.deepcopy(model), processing_class=tok)

    first = make(2)
    first.train()
    saved = first.rollout.algorithm_state()
    key = '{"type":"rae","decay":0.95}'
    baselines = saved[key]["baselines"]
    assert set(baselines) == {"kuhn_poker/player_0"} and baselines["kuhn_poker/player_0"] != 0
    checkpoint = out / "checkpoint-2"
    assert json.loads((checkpoint / ALGORITHM_STATE_FILE).read_text()) == saved

    # Resuming restores the baseline and trains on from it (a fresh one would start at 0).
    more = make(3)
    assert more.rollout.algorithm_state()[key] == {"baselines": {}}
    more.train(resume_from_checkpoint=str(checkpoint))
    assert more.state.global_step == 3 and more.rollout.episodes_played == 12  # restored 8, then one more round of 2 x 2
    b = baselines["kuhn_poker/player_0"]
    for ep in more.rollout.last_episodes:
        for t in ep.traces:
            if t.role == "player_0" and ep.ok:
                b = 0.95 * b + 0.05 * t.reward
    assert more.rollout.algorithm_state()[key]["baselines"]["kuhn_poker/player_0"] == pytest.approx(b)


# -- 8. two processes ------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_match_one_process(tmp_path):
    """torchrun (gloo, 2 CPU processes) vs 1 process on the same fixed rollout: token counts, RAE, loss, streams."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    script = str(HERE / "_two_process_check.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), script, str(tmp_path / "two")]
    two_procs = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    one_proc = subprocess.run([sys.executable, script, str(tmp_path / "one")], env=env, capture_output=True, text=True,
                              timeout=300)
    assert one_proc.returncode == 0, one_proc.stdout[-3000:] + one_proc.stderr[-3000:]
    output, _ = two_procs.communicate(timeout=300)
    assert two_procs.returncode == 0, output[-4000:]
    one = json.loads((tmp_path / "one" / "rank0.json").read_text())
    two = [json.loads((tmp_path / "two" / f"rank{r}.json").read_text()) for r in (0, 1)]

    assert one["world"] == 1 and [t["world"] for t in two] == [2, 2]
    # the loss read the logits at its positions only (the magnet term's path), through DDP on two processes
    assert [t["model_class"] for t in two] == ["DistributedDataParallel"] * 2
    assert one["full_logits_models"] == two[0]["full_logits_models"] == [] and "magnet/kl" in one["logs"][0]
    assert len(one["rounds"]) == 2
    assert one["rounds"][0]["num_ref_kl_tokens"] > 0 and one["rounds"][0]["num_ce_tokens"] > 0
    for t in two:
        assert t["rounds"] == one["rounds"]  # all-reduced counts: same on every rank and as one process
        assert t["state"] == one["state"]  # RAE baselines identical on every rank and as one process
    rae = next(v for k, v in one["state"].items() if '"rae"' in k)
    assert rae["baselines"]["kuhn_poker/player_0"] != 0
    # each rank trained its own share; together they carry the one-process streams (group credit across ranks)
    assert two[0]["streams"].keys().isdisjoint(two[1]["streams"])
    merged = {**two[0]["streams"], **two[1]["streams"]}
    assert merged.keys() == one["streams"].keys()
    for k, v in one["streams"].items():
        assert merged[k] == pytest.approx(v, abs=1e-9), k
    # loss normalisation across ranks: the first step's loss and gradient norm equal one process's
    assert two[0]["logs"][0]["loss"] == pytest.approx(one["logs"][0]["loss"], rel=1e-5)
    assert two[0]["logs"][0]["grad_norm"] == pytest.approx(one["logs"][0]["grad_norm"], rel=1e-5)
    # logged metrics are global numbers, not rank 0's share: per-algorithm losses, entropy, reverse KL
    first = one["logs"][0]
    assert {"loss/rl/rae", "loss/ce/echo", "loss/ref_kl/opd", "ref_kl/sampled_reverse_kl"} <= first.keys()
    for t in two:
        assert t["logs"][0].keys() == first.keys()
        for k, v in first.items():
            assert t["logs"][0][k] == pytest.approx(v, rel=1e-5, abs=1e-6), k


def mean_rl_entropy(model, batch) -> float:
    """Σ H(rl tokens) / N_rl with H the model's own per-token entropy, computed directly (the bonus's oracle)."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, -batch["completion_ids"].size(1) - 1 : -1]
        logp = torch.log_softmax(logits.float(), -1)
        entropy = -(logp.exp() * logp).sum(-1)
    return ((entropy * batch["rl_mask"]).sum() / batch["num_rl_tokens"]).item()


def test_entropy_bonus_subtracts_mean_entropy_of_rl_tokens(tmp_path, tiny, make_trace, make_episode, fixed_trainer,
                                                          mixed_args, loss_and_grads):
    """The entropy regulariser, coef c: loss = loss(c=0) − c · Σ H(rl tokens) / N_rl, with H the model's own
    per-token entropy."""
    experiment = {"algo": {"type": "grpo"}, "env": [{"id": "single", "instance": single_env(), "group_size": 4}]}
    plain = fixed_trainer(tmp_path / "a", tiny, experiment, _grpo_episodes(make_trace, make_episode))
    bonus = fixed_trainer(tmp_path / "b", tiny, experiment, _grpo_episodes(make_trace, make_episode),
                          regulariser=[{"type": "entropy", "coef": 0.25}])
    batch = plain._generate_and_score_completions(None)
    loss0, _ = loss_and_grads(plain, batch)
    loss1, _ = loss_and_grads(bonus, batch)
    assert abs((loss0 - loss1).item() - 0.25 * mean_rl_entropy(bonus.model, batch)) < 1e-5
    with pytest.raises(ValueError, match="use_adaptive_entropy"):
        mixed_args(tmp_path / "run", use_adaptive_entropy=True)
    with pytest.raises(ValueError, match=r"\[\[regulariser\]\] type = 'entropy', coef = 0.25"):
        mixed_args(tmp_path / "run", entropy_coef=0.25)  # TRL's own field points to the regulariser


def test_an_annealed_entropy_bonus_is_linear_between_its_steps(tmp_path, tiny, make_trace, make_episode,
                                                                fixed_trainer, mixed_args, loss_and_grads):
    """coef c0 → final c1 from step a to step b: at step s the bonus is c0 + (c1 − c0)·clip((s − a)/(b − a), 0, 1)."""
    experiment = {"algo": {"type": "grpo"}, "env": [{"id": "single", "instance": single_env(), "group_size": 4}]}
    plain = fixed_trainer(tmp_path / "a", tiny, experiment, _grpo_episodes(make_trace, make_episode))
    annealed = fixed_trainer(tmp_path / "b", tiny, experiment, _grpo_episodes(make_trace, make_episode),
                             regulariser=[{"type": "entropy", "coef": 0.5, "final": 0.1, "anneal_start": 2,
                                           "anneal_end": 6}])
    batch = plain._generate_and_score_completions(None)
    loss0, _ = loss_and_grads(plain, batch)
    mean_entropy = mean_rl_entropy(annealed.model, batch)
    for step, coef in ((0, 0.5), (2, 0.5), (3, 0.4), (5, 0.2), (6, 0.1), (9, 0.1)):
        annealed.state.global_step = step
        loss, _ = loss_and_grads(annealed, batch)
        assert abs((loss0 - loss).item() - coef * mean_entropy) < 1e-5, step
    with pytest.raises(ValueError, match="end must come after the start"):
        fixed_trainer(tmp_path / "c", tiny, experiment, [], regulariser=[
            {"type": "entropy", "coef": 0.3, "final": 0.0, "anneal_start": 5, "anneal_end": 5}])


# -- the magnet (R-NaD-style regularisation) ---------------------------------------------------


def rl_kl_by_hand(model, batch, magnet=None) -> float:
    """Σ KL(π ‖ ρ) over the rl tokens / N_rl from two plain forward passes: ρ the magnet's softmax, or uniform over
    the vocabulary (then KL = log V − H(π)). The oracle of the magnet term."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    T = batch["completion_ids"].size(1)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits[:, -T - 1:-1].float(), -1)
        if magnet is None:
            logq = torch.full_like(logp, -math.log(logp.size(-1)))
        else:
            logq = torch.log_softmax(magnet(input_ids=ids, attention_mask=mask).logits[:, -T - 1:-1].float(), -1)
        kl = (logp.exp() * (logp - logq)).sum(-1)
    return ((kl * batch["rl_mask"]).sum() / batch["num_rl_tokens"]).item()


def test_the_magnet_is_uniform_then_a_frozen_copy_of_the_policy(tmp_path, tiny, make_trace, make_episode,
                                                                fixed_trainer, loss_and_grads, grad_checks):
    """The magnet regulariser, coef β from start a, renewed every k: loss = loss(β=0) + β · Σ KL(π_θ ‖ ρ) / N_rl,
    with ρ uniform for steps [a, a + k) and from step a + k on the policy as it was at the last multiple of k after a."""
    _, max_grad_diff = grad_checks
    experiment = {"algo": {"type": "grpo"}, "env": [{"id": "single", "instance": single_env(), "group_size": 4}]}
    episodes = _grpo_episodes(make_trace, make_episode)
    plain = fixed_trainer(tmp_path / "a", tiny, experiment, episodes)
    magnet = [{"type": "magnet", "coef": 0.4, "start": 2, "every": 3}]
    pulled = fixed_trainer(tmp_path / "b", tiny, experiment, episodes, regulariser=magnet, max_steps=10)
    (pulled_magnet,) = pulled.regularisers
    batch = plain._generate_and_score_completions(None)
    loss0, _ = loss_and_grads(plain, batch)
    uniform = rl_kl_by_hand(pulled.model, batch)
    for step, expected in ((0, 0.0), (1, 0.0), (2, 0.4 * uniform), (4, 0.4 * uniform)):
        pulled.state.global_step = step
        pulled._generate_and_score_completions(None)
        loss, _ = loss_and_grads(pulled, batch)
        assert abs((loss - loss0).item() - expected) < 1e-5, step
    assert pulled_magnet.model is None
    pulled.state.global_step = 5  # a + k: the magnet becomes the policy as it is now, so the pull starts at zero
    pulled._generate_and_score_completions(None)
    loss, grads = loss_and_grads(pulled, batch)
    _, grads0 = loss_and_grads(plain, batch)
    assert abs((loss - loss0).item()) < 1e-6 and max_grad_diff(grads, grads0) < 1e-6
    with torch.no_grad():  # the policy moves on; the magnet stays where it was
        for p in pulled.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
        plain.model.load_state_dict(pulled.model.state_dict())
    for step in (6, 7):
        pulled.state.global_step = plain.state.global_step = step
        loss0, _ = loss_and_grads(plain, batch)
        loss, _ = loss_and_grads(pulled, batch)
        expected = 0.4 * rl_kl_by_hand(pulled.model, batch, pulled_magnet.model)
        assert expected > 1e-3 and abs((loss - loss0).item() - expected) < 1e-5, step
    pulled.create_optimizer_and_scheduler(num_training_steps=10)
    pulled._save_checkpoint(pulled.model, trial=None)  # the magnet travels in checkpoints
    folder = tmp_path / "b" / "checkpoint-7"
    resumed = fixed_trainer(tmp_path / "c", tiny, experiment, episodes, regulariser=magnet, max_steps=10)
    (resumed_magnet,) = resumed.regularisers
    policy = resumed.model
    resumed_magnet.load(str(folder), 7, policy, "cpu")
    assert all(torch.equal(a, b) for a, b in zip(resumed_magnet.model.state_dict().values(),
                                                 pulled_magnet.model.state_dict().values()))
    (folder / "magnet.pt").unlink()
    with pytest.raises(FileNotFoundError, match="magnet"):
        resumed_magnet.load(str(folder), 7, policy, "cpu")
    resumed_magnet.model = None  # a checkpoint at a + k is saved before that step's renewal
    resumed_magnet.load(str(folder), 5, policy, "cpu")
    assert resumed_magnet.model is None


def test_the_magnet_kl_reads_the_distribution_each_token_was_sampled_from():
    """kl_to_magnet against a by-hand sum: constrained rows over their allowed ids only, at each row's temperature,
    uniform over the support without a magnet; gradients stay finite around the masked ids."""
    from multiagent_rl.training.loss import kl_to_magnet

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 11, generator=gen, requires_grad=True)
    magnet = torch.randn(4, 11, generator=gen)
    allowed = torch.tensor([[3, 7, -1], [-1, -1, -1], [0, 5, 9], [2, -1, -1]])
    temps = torch.tensor([1.0, 0.7, 1.5, 1.0])
    got = kl_to_magnet(logits, magnet, temps, allowed)
    got_uniform = kl_to_magnet(logits, None, temps, allowed)
    for i in range(4):
        ids = [j for j in allowed[i].tolist() if j >= 0] or list(range(11))
        p = torch.softmax(logits[i, ids].detach() / temps[i], -1)
        q = torch.softmax(magnet[i, ids] / temps[i], -1)
        assert abs(got[i].item() - (p * (p.log() - q.log())).sum().item()) < 1e-6, i
        assert abs(got_uniform[i].item() - (p * (p.log() + math.log(len(ids)))).sum().item()) < 1e-6, i
    assert got[3].item() == 0.0  # a forced token: nothing to choose, nothing to pull
    (got.sum() + got_uniform.sum()).backward()
    assert torch.isfinite(logits.grad).all() and logits.grad[0, [3, 7]].abs().sum() > 0
    assert logits.grad[0, [0, 1, 2, 4]].abs().sum() == 0  # outside a constrained row's support: no gradient


def test_regulariser_settings_are_checked_naming_the_key():
    from multiagent_rl.config import ExperimentConfig

    for bad, key in (({"coef": -0.1}, "coef"), ({"coef": 0.5, "every": 0}, "every"), ({"coef": 0.5, "start": -1}, "start"),
                     ({"coef": 0.5, "evry": 3}, "evry")):
        with pytest.raises(ValueError, match=key):
            ExperimentConfig.model_validate({"env": [{"id": "kuhn_poker"}], "regulariser": [{"type": "magnet", **bad}]})
    with pytest.raises(ValueError, match="unknown regulariser 'magnit'; known: entropy, magnet"):
        ExperimentConfig.model_validate({"env": [{"id": "kuhn_poker"}], "regulariser": [{"type": "magnit"}]})


def test_the_lm_head_runs_only_where_the_loss_reads_unless_the_model_rescales_its_logits(
        tmp_path, tiny, make_trace, make_episode, fixed_trainer, caplog):
    """PolicyScorer.logits equals the model's own logits at the read positions: through the head at just those positions
    (rows in length buckets, each cut to its own columns) for the tiny Qwen2, and through the whole forward (with a warning, once) for a model that scales its logits
    after the head, as Granite's logits_scaling does."""
    model, tok = tiny

    class ScaledLogits(type(model)):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 2.0
            return out

    scaled = ScaledLogits(model.config)
    scaled.load_state_dict(model.state_dict())
    experiment = {"algo": {"type": "grpo"}, "env": [{"id": "single", "instance": single_env(), "group_size": 4}]}
    for name, policy in (("plain", model), ("scaled", scaled)):
        trainer = fixed_trainer(tmp_path / name, (policy, tok), experiment, _grpo_episodes(make_trace, make_episode))
        batch = trainer._generate_and_score_completions(None)
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
        T = batch["completion_ids"].size(1)
        read = batch["completion_mask"].bool()
        read[0] = False  # a row with nothing to read is not run; another reads only its first token
        read[1, 1:] = False
        assert len({int(n) for n in batch["prompt_mask"].sum(1)}) > 1  # rows of several lengths, run in buckets
        with torch.no_grad():
            expected = trainer.model(input_ids=ids, attention_mask=mask).logits[:, -T - 1:-1][read]
            for _ in range(2):
                caplog.clear()
                got = trainer.scorer.logits(trainer.model, ids, mask, T, read)
                assert torch.allclose(got, expected, atol=1e-5), name
        assert (type(trainer.model) in trainer.scorer.full_logits_models) == (name == "scaled")
    assert not caplog.records  # the second call: the fallback is remembered, not re-detected


def test_completions_of_mostly_observations_are_scored_at_the_read_positions_with_the_same_logprobs(
        tmp_path, tiny, make_trace, make_episode, fixed_trainer):
    """Multi-turn traces whose completions are mostly observations (a tool's output, the other seat's turn) are scored
    through the head at the action positions only; the logprobs there are TRL's fused pass's, to float rounding."""
    rng = random.Random(1)
    episodes = [make_episode(f"e{k}", "g0", "single", [make_trace("agent", [
        ("prompt", ids(rng, 4 + k)), ("action", ids(rng, 2)), ("observation", ids(rng, 30 + 3 * k)),
        ("action", ids(rng, 2))], r)]) for k, r in enumerate((1.0, 0.0, 0.5, 2.0))]
    experiment = {"algo": {"type": "grpo"}, "env": [{"id": "single", "instance": single_env(), "group_size": 4}]}
    trainer = fixed_trainer(tmp_path, tiny, experiment, episodes)
    batch = trainer._generate_and_score_completions(None)
    read = batch["action_mask"].bool()
    assert 4 * int(read.sum()) < int(batch["completion_mask"].sum())  # mostly observations
    calls = []
    fused = trainer.scorer.fused
    trainer.scorer.fused = lambda *a, **k: calls.append(1) or fused(*a, **k)
    with torch.no_grad():
        scored = trainer.scorer.score(trainer.model, batch, compute_entropy=True)
        ids_, mask = (torch.cat([batch[f"prompt_{k}"], batch[f"completion_{k}"]], 1) for k in ("ids", "mask"))
        expected, entropies, _ = fused(trainer.model, ids_, mask, batch["completion_ids"].size(1), compute_entropy=True)
    assert not calls and scored.read is not None  # the read-positions pass, not the fused one
    torch.testing.assert_close(scored.logps[read], expected[read], atol=1e-5, rtol=0)
    torch.testing.assert_close(scored.entropies[read], entropies[read], atol=1e-4, rtol=0)
