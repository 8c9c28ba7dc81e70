"""Traces as datasets: the exact round trip, Parquet shards, runs loading together, filters, SFT format."""

import random

import pytest

import multiagent_rl as mrl
from multiagent_rl.agents.agent import Agent
from multiagent_rl.algorithms import build_algorithm
from multiagent_rl.envs.kuhn_poker import KuhnPokerEnv
from multiagent_rl.envs.user_sim import UserSimEnv, careful_assistant, hasty_assistant, scripted_user
from multiagent_rl.data.sinks import JsonlEpisodeSink
from multiagent_rl.data.traces import (ParquetEpisodeSink, dataset_to_episodes, episodes_to_dataset, filter_traces,
                                         load_traces, to_sft_messages, to_sft_prompt_completion, trace_features)
from multiagent_rl.episodes.records import episode_record


@pytest.fixture
def kuhn_episodes(backend):
    """Real episodes: the tiny model through the legal-action harness (logprobs, allowed ids), scored by GRPO."""
    env = KuhnPokerEnv()
    agent = Agent(mrl.AgentConfig(model="tiny", sampling={"max_new_tokens": 4}), backend)
    tasks = env.sample_tasks(4, random.Random(0))
    episodes = mrl.run_sync(mrl.play_episodes(env, tasks, {"player_0": agent, "player_1": agent}, group_size=2,
                                              seed="0", trainable={"player_0": True, "player_1": True}))
    build_algorithm({"type": "grpo"}).score_group(episodes)
    return episodes


def user_sim_episodes(assistant):
    env = UserSimEnv(menu=True)
    agents = {"user": mrl.make_agent(mrl.AgentConfig(model="scripted", policy=scripted_user())),
              "assistant": mrl.make_agent(mrl.AgentConfig(model="scripted", policy=assistant))}
    return mrl.run_sync(mrl.play_episodes(env, env.sample_tasks(6, random.Random(1)), agents, seed="1",
                                          trainable={"user": False, "assistant": True}))


def test_episodes_to_dataset_and_back_is_exact(kuhn_episodes):
    pairs = [(3, ep) for ep in kuhn_episodes] + [(4, ep) for ep in user_sim_episodes(careful_assistant())]
    ds = episodes_to_dataset(pairs, run="r")
    assert ds.features == trace_features() and len(ds) == sum(len(ep.traces) for _, ep in pairs)
    assert any(a is not None for row in ds for a in row["allowed"])  # constrained choices were recorded
    assert any(lp is not None for row in ds for lp in row["logprobs"])
    assert any(row["algorithm"] == "grpo" and row["advantage_mean"] is not None for row in ds)
    back = dataset_to_episodes(ds)
    assert [(s, episode_record(ep)) for s, ep in back] == [(s, episode_record(ep)) for s, ep in pairs]


def test_non_finite_numbers_are_written_as_null_and_ids_are_untouched(tmp_path, kuhn_episodes):
    """The sinks clean only the float-bearing fields: NaN/inf become null there, token and allowed ids pass as they are."""
    import copy
    import json

    from multiagent_rl.episodes.records import trace_record

    episode = copy.deepcopy(kuhn_episodes[0])
    trace = next(t for t in episode.traces if t.streams is not None and t.streams.advantages)
    action = next(s for s in trace.segments if s.logprobs)
    action.logprobs[0] = float("nan")
    trace.streams.advantages[-1] = float("inf")
    trace.rewards[0].value = float("-inf")
    record = trace_record(trace)
    json.dumps(record, allow_nan=False)
    assert record["rewards"][0]["value"] is None and record["reward"] is None
    assert None in record["streams"]["advantages"] and None in [lp for s in record["segments"] for lp in s["logprobs"] or []]
    assert [s["token_ids"] for s in record["segments"]] == [s.token_ids for s in trace.segments]
    assert [s["allowed"] for s in record["segments"]] == [s.allowed for s in trace.segments]
    sink = ParquetEpisodeSink(tmp_path / "traces")
    sink.write([episode], 0)
    row = load_traces(tmp_path)[episode.traces.index(trace)]
    assert row["reward"] is None and row["token_ids"] == trace.token_ids
    assert row["advantage_mean"] is None  # a summary over a non-finite advantage would hide it
    unscored = [lp for s in trace.segments for lp in s.logprobs or [None] * len(s.token_ids)].count(None)
    assert row["logprobs"].count(None) == unscored + 1  # the NaN


def test_parquet_shards_of_two_runs_load_together_and_resume_drops_later_steps(tmp_path, kuhn_episodes):
    a = ParquetEpisodeSink(tmp_path / "a" / "traces", rank=0, run="a")
    for step in range(3):
        a.write(kuhn_episodes, step)
    b = ParquetEpisodeSink(tmp_path / "b" / "traces", rank=0, run="b")
    b.write(user_sim_episodes(hasty_assistant()), 0)
    assert sorted(p.name for p in (tmp_path / "a" / "traces" / "rank0").iterdir()) == [
        "step-000000.parquet", "step-000001.parquet", "step-000002.parquet"]
    a.resume(1)
    b.resume(0)  # a fresh run in b's folder: b's shards are moved aside, not deleted, and not loaded as this run's
    assert [p.name for p in (tmp_path / "b" / "traces").iterdir() if p.name != "rank0"][0].startswith("rank0.")
    assert not list((tmp_path / "b" / "traces" / "rank0").iterdir())
    b.write(user_sim_episodes(hasty_assistant()), 0)
    both = load_traces([tmp_path / "a", tmp_path / "b"])
    per_episode = sum(len(ep.traces) for ep in kuhn_episodes)
    assert sorted(set(both["run"])) == ["a", "b"] and both["run"].count("a") == per_episode
    assert set(both["env"]) == {"kuhn_poker", "user_sim"}
    # a JSON-lines episode log (episode_format = "jsonl") loads the same way
    JsonlEpisodeSink(tmp_path / "c" / "episodes", rank=0).write(kuhn_episodes, 7)
    old = load_traces(tmp_path / "c" / "episodes")
    assert set(old["run"]) == {"c"} and set(old["step"]) == {7} and len(old) == per_episode


def test_filters_and_the_sft_format(kuhn_episodes):
    ds = episodes_to_dataset([(s, ep) for s, ep in enumerate(user_sim_episodes(careful_assistant()))]
                             + [(10, ep) for ep in kuhn_episodes])
    best = filter_traces(ds, env="user_sim", role="assistant", min_reward=1.0, steps=(0, 5))
    assert len(best) == 6 and set(best["role"]) == {"assistant"}
    assert len(filter_traces(ds, steps=(10, 10))) == sum(len(ep.traces) for ep in kuhn_episodes)
    sft = to_sft_messages(best)
    from trl.data_utils import is_conversational

    assert sft.column_names == ["messages"] and is_conversational(sft[0])
    assert sft[0]["messages"][-1]["role"] == "assistant" and sft[0]["messages"][-1]["content"].startswith("BOOK")
    pc = to_sft_prompt_completion(best)  # one row per assistant reply, the reply as the completion
    assert len(pc) == sum(sum(m["role"] == "assistant" for m in row["messages"]) for row in best)
    assert is_conversational(pc[0]) and pc[0]["completion"][0]["role"] == "assistant"
    assert pc[0]["prompt"] == sft[0]["messages"][:len(pc[0]["prompt"])]
