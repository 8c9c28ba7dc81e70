"""Proposer–solver: proposal parsing, the safe evaluator, planted solve rates give each proposer reward exactly,
scripted players end to end, the hierarchical baselines, one policy for both roles or two models."""

from __future__ import annotations

import copy
import random

import pytest
import torch

import multiagent_rl as mrl
from multiagent_rl.algorithms import build_algorithm
from multiagent_rl.envs.base import play_episodes, run_sync
from multiagent_rl.envs import proposer_solver as ps
from multiagent_rl.envs.proposer_solver.problems import LEVELS, TOPICS, evaluate, level_of, make_problem
from multiagent_rl.envs.proposer_solver.rewards import absolute_zero, learnability, r_zero
from multiagent_rl.training.trainer import MixedAlgorithmConfig, MixedAlgorithmTrainer


@pytest.mark.parametrize("reply, parsed", [
    ('{"problem": "3 + 4", "answer": 7}', ("3 + 4", 7)),
    ('Here is one.\n```json\n{"problem": "12 * 3", "answer": 36}\n```\n', ("12 * 3", 36)),
    ('  {"difficulty": 2, "problem": "40 - 1", "answer": 39}  ', ("40 - 1", 39)),
    ('I think {"a": {"b": 1}} then {"problem": "1 + {2}", "answer": 3}', ("1 + {2}", 3)),
    ('{"problem": "3 + 4", "answer": 7} and some words after', None),  # must END with the object
    ('{"problem": "3 + 4", "answer": "7"}', None),  # answer must be an int
    ('{"problem": "3 + 4", "answer": 7.0}', None),
    ('{"problem": "3 + 4", "answer": true}', None),
    ('{"problem": "", "answer": 7}', None),
    ('{"question": "3 + 4", "answer": 7}', None),
    ('{"problem": "3 + 4", "answer": 7', None),
    ("no json at all", None),
])
def test_proposals_are_parsed_strictly_but_tolerate_fences(reply, parsed):
    assert ps.parse_proposal(reply) == parsed


def test_the_arithmetic_evaluator_is_safe_and_levels_are_recognised():
    rng = random.Random(0)
    for level in LEVELS:
        for topic in ("addition", "subtraction", "multiplication", "mixed"):
            problem, answer = make_problem(topic, level, rng)
            assert evaluate(problem) == answer and level_of(problem) <= level  # the easiest level it fits
    assert [level_of(p) for p in ("3 + 4", "3 + 9", "3 + 9 - 1", "12 * 99", "10 + 11 + 12", "100 - 999")] == [
        1, 2, 3, 4, 5, 6]
    assert evaluate("-(3 - 10) * 2") == 14
    for bad in ("2 ** 10", "7 / 2", "x + 1", "open('f')", "1; 2", "3.5 + 1", "[1][0]", "9" * 20 + " * " + "9" * 20):
        with pytest.raises(ValueError):
            evaluate(bad)
    assert ps.last_integer("I think 3, no: -12.") == -12 and ps.last_integer("none") is None


def planted_solver(solved_per_episode: int, solvers: int = 4):
    """The first ``solved_per_episode`` of every ``solvers`` consecutive replies are right, the rest wrong."""
    calls = {"n": 0}

    def act(turn) -> str:
        k, calls["n"] = calls["n"] % solvers, calls["n"] + 1
        answer = evaluate(turn.state["problem"])
        return str(answer if k < solved_per_episode else answer + 1)

    return act


def scripted(policy):
    return mrl.make_agent(mrl.AgentConfig(model="scripted", policy=policy))


@pytest.mark.parametrize("reward, fn", [("learnability", learnability), ("absolute_zero", absolute_zero),
                                        ("r_zero", r_zero)])
@pytest.mark.parametrize("solved", [0, 1, 2, 3, 4])
def test_planted_solve_rates_give_exactly_each_proposer_reward(reward, fn, solved):
    env = ps.ProposerSolverEnv(solvers=4, reward=reward)
    agents = {"proposer": scripted(ps.uniform_proposer()), "solver": scripted(planted_solver(solved))}
    tasks = env.sample_tasks(3, random.Random(1))
    for ep in run_sync(play_episodes(env, tasks, agents, seed="0")):
        assert ep.ok, ep.errors
        (proposer,) = ep.by_role("proposer")
        solvers = ep.by_role("solver")
        p = solved / 4
        assert len(solvers) == 4 and [t.reward for t in solvers] == [1.0] * solved + [0.0] * (4 - solved)
        assert proposer.reward == fn(p) and proposer.metrics["solve_rate"] == p
        assert proposer.metrics["learnability"] == 4 * p * (1 - p) and proposer.metrics["valid"] == 1.0
        level = proposer.metrics["difficulty"]
        assert all(t.metrics["difficulty"] == level for t in solvers)
        assert sum(proposer.metrics[f"level_{d}"] for d in LEVELS) == 1.0
    assert absolute_zero(0.0) == 0.0 and absolute_zero(1.0) == 0.0 and r_zero(0.5) == 0.5


def test_an_invalid_proposal_scores_zero_and_runs_no_solver():
    env = ps.ProposerSolverEnv(solvers=4, verify=True)
    replies = iter(['```json\n{"problem": "2 + 2", "answer": 5}\n```', "I cannot think of one.",
                    '{"problem": "2 + 2", "answer": 4}'])
    agents = {"proposer": scripted(lambda turn: next(replies)), "solver": scripted(ps.accurate_solver(1.0))}
    task = env.sample_tasks(1, random.Random(0))[0]
    episodes = [run_sync(env.play(task, agents, seed="0")) for _ in range(3)]
    for ep, valid in zip(episodes, (0.0, 0.0, 1.0)):  # wrong answer (verified), no JSON, right
        (proposer,) = ep.by_role("proposer")
        assert proposer.metrics["valid"] == valid
        assert len(ep.by_role("solver")) == (4 if valid else 0)
    assert episodes[0].by_role("proposer")[0].reward == 0.0
    assert episodes[2].by_role("proposer")[0].reward == learnability(1.0) == 0.0  # everyone solved it


def test_scripted_players_end_to_end_and_the_menu_is_a_choice_of_difficulty(backend):
    env = ps.ProposerSolverEnv(solvers=3, menu=True, levels=[1, 2, 3])
    tasks = env.sample_tasks(4, random.Random(2))
    agents = {"proposer": scripted(ps.uniform_proposer()), "solver": scripted(ps.accurate_solver(0.5))}
    episodes = run_sync(play_episodes(env, tasks, agents, group_size=4, seed="0"))
    assert all(ep.ok for ep in episodes) and len(episodes) == 16
    levels = {ep.by_role("proposer")[0].metrics["difficulty"] for ep in episodes}
    assert levels <= {1.0, 2.0, 3.0} and len(levels) > 1
    # with a model: the proposal is constrained to the menu, its one free token is the difficulty digit
    policy = mrl.Agent(mrl.AgentConfig(model="policy"), backend)
    (ep,) = run_sync(play_episodes(env, tasks[:1], {"proposer": policy, "solver": agents["solver"]}, seed="0"))
    (proposer,) = ep.by_role("proposer")
    assert proposer.last_reply in env.menu_for(tasks[0])
    free = [a for a in proposer.allowed_token_ids if a is not None and len(a) > 1]
    assert len(free) == 1 and len(free[0]) == 3  # three levels to choose from, then every token is forced


def test_hierarchical_baselines_group_solvers_by_episode_and_proposers_by_task():
    env = ps.ProposerSolverEnv(solvers=4)
    agents = {"proposer": scripted(ps.uniform_proposer()), "solver": scripted(planted_solver(0))}
    task = env.sample_tasks(1, random.Random(0))[0]
    solved = [1, 2, 3]
    episodes = []
    for k, m in enumerate(solved):  # three episodes of one task group, with 1, 2 and 3 of 4 solvers right
        agents["solver"] = scripted(planted_solver(m))
        ep = run_sync(env.play(task, agents, trainable={"proposer": True, "solver": True}, seed="0"))
        ep.group = "g"
        episodes.append(ep)
    algo = build_algorithm(ps.ProposerSolverEnv.default_algo)
    algo.score_group(episodes)
    proposer_rewards = [learnability(m / 4) for m in solved]

    def advantage(trace) -> float:
        (value,) = {a for a, kind in zip(trace.streams.advantages, trace.token_kinds) if kind == "action"}
        return value

    for ep, m, r in zip(episodes, solved, proposer_rewards):
        (proposer,) = ep.by_role("proposer")  # baselined across the task group's three proposals
        assert advantage(proposer) == pytest.approx(r - sum(proposer_rewards) / 3)
        for t in ep.by_role("solver"):  # baselined within the episode: the mean of its 4 solvers is m/4
            assert advantage(t) == pytest.approx(t.reward - m / 4)


def _trainer(tmp_path, tiny, roles):
    model, tok = tiny
    experiment = {"env": [{"id": "proposer_solver", "group_size": 2, "args": {"menu": True, "solvers": 2,
                                                                          "levels": [1, 2]}, "roles": roles}]}
    args = MixedAlgorithmConfig(output_dir=str(tmp_path), max_steps=2, report_to=[], save_strategy="no",
                                save_episodes=False, groups_per_step=2, learning_rate=1e-3, disable_tqdm=True,
                                max_completion_length=8)
    return MixedAlgorithmTrainer(experiment, args=args, model=copy.deepcopy(model), processing_class=tok)


def test_one_policy_for_both_roles_or_a_frozen_solver_model(tmp_path, tiny):
    both = _trainer(tmp_path / "both", tiny, {})
    assert both.rollout.algorithms and {a.name for a in both.rollout.algorithms.values()} == {"hierarchical_grpo"}
    both.train()
    eps = both.rollout.last_episodes
    assert all(ep.ok for ep in eps)
    assert {t.model for ep in eps for t in ep.traces} == {"policy"}
    assert all(t.trainable and t.streams is not None for ep in eps for t in ep.traces)

    frozen = _trainer(tmp_path / "two", tiny, {"solver": {"model": "tiny", "trainable": False}})
    frozen.train()
    eps = frozen.rollout.last_episodes
    solvers = [t for ep in eps for t in ep.by_role("solver")]
    proposers = [t for ep in eps for t in ep.by_role("proposer")]
    assert solvers and all(t.model == "tiny" and not t.trainable and t.streams is None for t in solvers)
    assert all(t.model == "policy" and t.streams is not None for t in proposers)
    logged = [h for h in frozen.state.log_history if "loss" in h][-1]
    assert "proposer_solver/proposer/hierarchical_grpo/valid" in logged
    assert "proposer_solver/solver/untrained/correct" in logged
    assert torch.isfinite(torch.tensor(logged["loss"]))


@pytest.mark.parametrize("topic", sorted(TOPICS))
def test_the_instructed_proposer_prompt_shows_a_valid_verified_proposal(topic):
    """The worked example a chat model is shown is itself a proposal the env accepts with verify=True."""
    prompt = ps.proposer_prompt(topic, "instructed")
    problem, answer = ps.parse_proposal(prompt.split(" like ")[1].split(". Do not")[0])
    assert evaluate(problem) == answer
    assert "number only" in ps.solver_prompt("3 + 4", "instructed")
    assert ps.solver_prompt("3 + 4") == "Solve: 3 + 4 = ?"  # the default wording is unchanged


def test_the_instructed_example_varies_per_task_and_a_copy_of_it_is_invalid():
    """A fixed worked example is a proposal a chat model can copy for reward (a SmolLM2 run collapsed onto it):
    the example is drawn per task, and repeating it scores like any invalid proposal."""
    env = ps.ProposerSolverEnv(solvers=2, verify=True, prompts="instructed", levels=[1, 2, 3])
    tasks = env.sample_tasks(16, random.Random(0))
    examples = [t.data.info["example"] for t in tasks]
    assert len(set(examples)) > 8 and all(ex in t.data.prompt for ex, t in zip(examples, tasks))
    assert {level_of(ex) for ex in examples} == {1, 2, 3}
    assert env.sample_tasks(16, random.Random(0))[3].data.prompt == tasks[3].data.prompt  # seeded
    example = examples[0]
    other, other_answer = make_problem("addition", 2, random.Random(5))
    replies = iter([ps.proposal_text(example.replace(" ", "  "), evaluate(example)),
                    ps.proposal_text(other, other_answer)])
    agents = {"proposer": scripted(lambda turn: next(replies)), "solver": scripted(ps.accurate_solver(1.0))}
    copied, fresh = (run_sync(env.play(tasks[0], agents, seed="0")).by_role("proposer")[0] for _ in range(2))
    assert (copied.metrics["valid"], copied.metrics["copied_example"], copied.reward) == (0.0, 1.0, 0.0)
    assert (fresh.metrics["valid"], fresh.metrics["copied_example"]) == (1.0, 0.0)
    assert "copied_example" not in run_sync(ps.ProposerSolverEnv(solvers=1).play(
        ps.ProposerSolverEnv().sample_tasks(1, random.Random(0))[0], agents | {"proposer": scripted(
            lambda turn: ps.proposal_text(other, other_answer))}, seed="0")).by_role("proposer")[0].metrics


def test_an_unknown_prompt_wording_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"prompts='chatty': one of 'short', 'instructed'"):
        ps.ProposerSolverEnv(prompts="chatty")
