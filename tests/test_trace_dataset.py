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


# -- loading errors, the schema version, layouts, filters that match nothing, shard roll-over -------------------


def _one_shard(tmp_path, kuhn_episodes, **sink_args):
    """A rank folder with the shard of one step; returns (traces folder, shard path)."""
    sink = ParquetEpisodeSink(tmp_path / "traces", **sink_args)
    sink.write(kuhn_episodes, 0)
    (shard,) = (tmp_path / "traces" / "rank0").glob("*.parquet")
    return tmp_path / "traces", shard


def test_a_truncated_shard_is_named_with_the_fix(tmp_path, kuhn_episodes):
    folder, shard = _one_shard(tmp_path, kuhn_episodes)
    ParquetEpisodeSink(folder).write(kuhn_episodes, 1)
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # a copy cut short
    with pytest.raises(ValueError) as err:
        load_traces(folder)
    message = str(err.value)
    assert str(shard) in message and "truncated" in message and "move it" in message
    assert len(message.splitlines()) <= 6


def test_a_shard_of_another_schema_names_the_columns_that_differ(tmp_path, kuhn_episodes):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder, shard = _one_shard(tmp_path, kuhn_episodes)
    table = pq.read_table(shard).drop_columns(["reward"])
    table = table.set_column(table.schema.get_field_index("step"), "step", pa.array([str(s) for s in table["step"].to_pylist()]))
    table = table.append_column("extra", pa.array([1] * len(table)))
    pq.write_table(table, shard)
    with pytest.raises(ValueError) as err:
        load_traces(folder)
    message = str(err.value)
    assert str(shard) in message and "missing: reward" in message and "unexpected: extra" in message
    assert "step (int64 expected, string found)" in message
    assert len(message.splitlines()) <= 8  # not the ~170 lines of a cast error


def test_the_schema_version_is_stored_in_every_shard_and_checked_on_load(tmp_path, kuhn_episodes):
    import pyarrow.parquet as pq

    from multiagent_rl.data.traces import SCHEMA_VERSION

    folder, shard = _one_shard(tmp_path, kuhn_episodes)
    metadata = pq.read_metadata(shard).metadata
    assert metadata[b"multiagent_rl.schema_version"] == str(SCHEMA_VERSION).encode()
    table = pq.read_table(shard)
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata, b"multiagent_rl.schema_version": b"999"}),
                   shard)
    with pytest.raises(ValueError, match=rf"schema version 999.*reads version {SCHEMA_VERSION}") as err:
        load_traces(folder)
    assert str(shard) in str(err.value)


def test_shards_written_before_the_schema_had_a_version_still_load(tmp_path, kuhn_episodes):
    """Version 1 shards (no version in their metadata, no env_id or policy column) and version 2 shards (no policy
    column) load beside current ones, with the missing columns null."""
    import pyarrow.parquet as pq

    folder, shard = _one_shard(tmp_path, kuhn_episodes)
    table = pq.read_table(shard).drop_columns(["env_id", "policy"])
    pq.write_table(table.replace_schema_metadata({b"huggingface": table.schema.metadata[b"huggingface"]}), shard)
    ParquetEpisodeSink(folder).write(kuhn_episodes, 1)  # a current shard beside it
    second = next(p for p in sorted((folder).rglob("*.parquet")) if p != shard)
    ParquetEpisodeSink(folder).write(kuhn_episodes, 2)
    third = next(p for p in sorted((folder).rglob("*.parquet")) if p not in (shard, second))
    table = pq.read_table(third).drop_columns(["policy"])
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata, b"multiagent_rl.schema_version": b"2"}),
                   third)
    every = load_traces(folder)
    assert every.features == trace_features() and sorted(set(every["step"])) == [0, 1, 2]
    assert set(every["env_id"]) == set(every["policy"]) == {None}


def test_a_single_shard_file_a_flat_folder_and_a_single_log_file_load(tmp_path, kuhn_episodes):
    import shutil

    folder, shard = _one_shard(tmp_path, kuhn_episodes)
    ParquetEpisodeSink(folder).write(kuhn_episodes, 1)
    per_step = sum(len(ep.traces) for ep in kuhn_episodes)
    assert len(load_traces(shard)) == per_step
    flat = tmp_path / "flat"
    shutil.copytree(folder / "rank0", flat)
    assert len(load_traces(flat)) == 2 * per_step
    JsonlEpisodeSink(tmp_path / "episodes").write(kuhn_episodes, 3)
    assert set(load_traces(tmp_path / "episodes" / "rank0.jsonl")["step"]) == {3}
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        load_traces(tmp_path / "missing")


def test_a_filter_that_matches_nothing_warns_and_lists_what_is_there(caplog, kuhn_episodes):
    ds = episodes_to_dataset([(0, ep) for ep in kuhn_episodes])
    with caplog.at_level("WARNING"):
        assert len(filter_traces(ds, env="kuhn_selfplay")) == 0
    (record,) = [r for r in caplog.records if "no trace matches" in r.getMessage()]
    assert "kuhn_poker" in record.getMessage() and "player_0" in record.getMessage()


def test_rows_carry_the_env_id_and_filters_take_the_id_or_the_label(tmp_path, kuhn_episodes):
    import copy

    labelled = [copy.copy(ep) for ep in kuhn_episodes]
    for ep in labelled:
        ep.env = "kuhn_poker_warmup"
    ids = {"kuhn_poker_warmup": "kuhn_poker"}
    ParquetEpisodeSink(tmp_path / "traces", env_ids=ids).write(labelled, 0)
    JsonlEpisodeSink(tmp_path / "episodes", env_ids=ids).write(labelled, 0)
    for ds in (load_traces(tmp_path / "traces"), load_traces(tmp_path / "episodes"),
               episodes_to_dataset([(0, ep) for ep in labelled], env_ids=ids)):
        assert set(ds["env"]) == {"kuhn_poker_warmup"} and set(ds["env_id"]) == {"kuhn_poker"}
        assert len(filter_traces(ds, env="kuhn_poker")) == len(filter_traces(ds, env="kuhn_poker_warmup")) == len(ds)
    assert len(filter_traces(ds, model="tiny")) == len(ds) and len(filter_traces(ds, model="scripted")) == 0


def _steps_of(folder) -> list[int]:
    return sorted(load_traces(folder)["step"])


def test_shards_roll_over_and_resuming_drops_exactly_the_later_steps(tmp_path, kuhn_episodes):
    per_step = sum(len(ep.traces) for ep in kuhn_episodes)
    folder = tmp_path / "traces"
    sink = ParquetEpisodeSink(folder, steps_per_shard=3)
    for step in range(8):
        sink.write(kuhn_episodes, step)
    names = sorted(p.name for p in (folder / "rank0").iterdir())
    assert names == ["step-000006.parquet", "step-000007.parquet", "steps-000000-000002.parquet",
                     "steps-000003-000005.parquet"]
    assert _steps_of(folder) == [s for s in range(8) for _ in range(per_step)]
    resumed = ParquetEpisodeSink(folder, steps_per_shard=3)  # a new process, resuming from the checkpoint of step 4
    resumed.resume(4)
    assert sorted(p.name for p in (folder / "rank0").iterdir()) == ["steps-000000-000002.parquet",
                                                                    "steps-000003-000003.parquet"]
    for step in range(4, 6):
        resumed.write(kuhn_episodes, step)
    assert _steps_of(folder) == [s for s in range(6) for _ in range(per_step)]
    resumed.close()  # the last steps merged too
    assert sorted(p.name for p in (folder / "rank0").iterdir()) == [
        "steps-000000-000002.parquet", "steps-000003-000003.parquet", "steps-000004-000005.parquet"]
    assert _steps_of(folder) == [s for s in range(6) for _ in range(per_step)]
    resumed.write(kuhn_episodes, 6)
    resumed.write(kuhn_episodes, 6)  # a second rollout in step 6 (several per optimizer step): kept, not overwritten
    assert _steps_of(folder) == [s for s in range(7) for _ in range(per_step * (2 if s == 6 else 1))]


def test_a_crash_while_rolling_over_leaves_no_torn_or_doubled_shard(tmp_path, kuhn_episodes, monkeypatch):
    from pathlib import Path

    per_step = sum(len(ep.traces) for ep in kuhn_episodes)
    folder = tmp_path / "traces"
    sink = ParquetEpisodeSink(folder, steps_per_shard=3)
    sink.write(kuhn_episodes, 0)
    sink.write(kuhn_episodes, 1)

    def killed(self, *args, **kwargs):
        raise KeyboardInterrupt("killed")

    with monkeypatch.context() as patch:  # killed after the merged shard is in place, before the step files go
        patch.setattr(Path, "unlink", killed)
        with pytest.raises(KeyboardInterrupt):
            sink.write(kuhn_episodes, 2)
    (folder / "rank0" / ".steps-000003-000004.parquet.tmp").write_bytes(b"PAR1 torn")  # an earlier kill mid-write
    assert len(list((folder / "rank0").glob("step-*.parquet"))) == 3
    assert _steps_of(folder) == [s for s in range(3) for _ in range(per_step)]  # each step once
    resumed = ParquetEpisodeSink(folder, steps_per_shard=3)
    resumed.resume(2)
    assert sorted(p.name for p in (folder / "rank0").iterdir()) == ["steps-000000-000001.parquet"]
    assert _steps_of(folder) == [s for s in range(2) for _ in range(per_step)]
