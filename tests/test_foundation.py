"""Agents, environments and the batched transformers backend (issue: foundation)."""

import asyncio
import json

import pytest
import torch

import multiagent_rl as mrl
from multiagent_rl.agents.agent import Agent
from multiagent_rl.episodes.records import episode_from_record, episode_record


def run(coro):
    return asyncio.run(coro)


class Chatter(mrl.Env):
    """The env speaks as the user for `turns` turns."""

    name = "chatter"
    roles = ("agent",)

    def __init__(self, turns=3):
        self.turns = turns

    async def run(self, task, agents):
        async with agents["agent"].interaction(task) as it:
            await it.send()
            for k in range(self.turns - 1):
                await it.send(f"Please try again {k}.")
        it.trace.add_reward("len", len(it.trace.token_ids))


def test_multi_turn_traces_are_token_exact(backend):
    seen = []
    original = backend.generate

    async def spy(prompt_ids, params, messages=None):
        gen = await original(prompt_ids, params, messages)
        seen.append((list(prompt_ids), gen.token_ids))
        return gen

    backend.generate = spy
    agent = Agent(mrl.AgentConfig(model="tiny", sampling={"max_new_tokens": 6}), backend)
    ep = run(Chatter(turns=4).play(mrl.Task(mrl.TaskData(prompt="Hello!")), {"agent": agent}))
    assert ep.ok, ep.errors
    (trace,) = ep.traces
    assert len(seen) == 4
    # Turn k+1's input starts with exactly turn k's input + completion.
    for (prev_in, prev_out), (nxt_in, _) in zip(seen, seen[1:]):
        assert nxt_in[: len(prev_in) + len(prev_out)] == prev_in + prev_out
        assert len(nxt_in) > len(prev_in) + len(prev_out)  # the observation was appended as tokens
    last_in, last_out = seen[-1]
    assert trace.token_ids == last_in + last_out
    actions = [s.token_ids for s in trace.segments if s.kind == "action"]
    assert actions == [out for _, out in seen]
    assert [s.kind for s in trace.segments] == ["prompt"] + ["action", "observation"] * 3 + ["action"]
    # The observation tokens are the template's rendering of the user turn.
    tok = backend.tokenizer
    obs_text = tok.decode(trace.segments[2].token_ids)
    assert "<|im_start|>user\nPlease try again 0.<|im_end|>\n<|im_start|>assistant\n" in obs_text
    assert [m["role"] for m in trace.messages] == ["user", "assistant"] * 4


def test_sampled_logprobs_match_a_fresh_forward(backend, tiny):
    model, _ = tiny
    agent = Agent(mrl.AgentConfig(model="tiny", sampling={"max_new_tokens": 8, "temperature": 1.0}), backend)

    async def many():
        tasks = [mrl.Task(mrl.TaskData(prompt=p)) for p in ["Hello!", "What is 2 + 2?", "Solve the problem."]]
        return await asyncio.gather(*[agent.run(t) for t in tasks])

    for trace in run(many()):
        ids = torch.tensor([trace.token_ids])
        with torch.no_grad():
            logps = torch.log_softmax(model(ids).logits.float(), -1)[0]
        start = trace.prompt_length
        action = trace.segments[1]
        fresh = logps[start - 1 : start - 1 + len(action.token_ids)].gather(-1, torch.tensor(action.token_ids)[:, None])
        assert torch.allclose(fresh.squeeze(-1), torch.tensor(action.logprobs), atol=1e-4)


def test_concurrent_episodes_are_batched_and_greedy_matches_sequential(tiny):
    model, tok = tiny
    sampling = {"max_new_tokens": 5, "temperature": 0.0}
    env = Chatter(turns=3)
    tasks = [mrl.Task(mrl.TaskData(prompt=f"What is {i} + {i}?")) for i in range(12)]

    batched = mrl.TransformersBackend(model, tok)
    agent = Agent(mrl.AgentConfig(sampling=sampling), batched)
    eps = run(mrl.play_episodes(env, tasks, {"agent": agent}))
    assert all(e.ok for e in eps)
    assert batched.num_requests == 12 * 3
    assert batched.num_generate_calls <= 2 * 3  # ~one call per turn, not one per episode-turn

    one_by_one = mrl.TransformersBackend(model, tok)
    solo = Agent(mrl.AgentConfig(sampling=sampling), one_by_one)
    for task, ep in zip(tasks, eps):
        (alone,) = run(env.play(task, {"agent": solo})).traces
        assert alone.token_ids == ep.traces[0].token_ids
    assert one_by_one.num_generate_calls == 12 * 3


class Flaky(mrl.Env):
    roles = ("agent",)

    async def run(self, task, agents):
        trace = await agents["agent"].run(task)
        if task.data.info["i"] == 3:
            raise RuntimeError("boom in episode 3")
        trace.add_reward("r", 1.0)


def scripted(reply="bet", delay=0.0):
    async def policy(turn):
        await asyncio.sleep(delay)
        return reply

    return mrl.make_agent(mrl.AgentConfig(model="scripted", policy=policy))


def test_one_failing_episode_is_recorded_and_the_others_go_on():
    tasks = [mrl.Task(mrl.TaskData(prompt="hi", info={"i": i})) for i in range(10)]
    eps = run(mrl.play_episodes(Flaky(), tasks, {"agent": scripted()}, trainable={"agent": True}))
    assert len(eps) == 10
    bad = [e for e in eps if not e.ok]
    assert len(bad) == 1 and "boom in episode 3" in bad[0].errors[0]
    good = [e for e in eps if e.ok]
    assert all(e.traces[0].reward == 1.0 and e.traces[0].trainable for e in good)


def test_a_hung_agent_is_cut_by_its_timeout():
    async def hang(turn):
        await asyncio.sleep(3600)

    slow = mrl.make_agent(mrl.AgentConfig(model="scripted", policy=hang, timeout=0.2))
    tasks = [mrl.Task(mrl.TaskData(prompt="hi", info={"i": i})) for i in range(2)]
    eps = run(mrl.play_episodes(Flaky(), tasks, {"agent": slow}))
    assert [e.ok for e in eps] == [False, False]
    assert all(e.errors[0].startswith("env 'env': ReplyTimeout: role 'agent' (scripted): no reply within 0.2 s")
               for e in eps), eps[0].errors
    # the episode-level timeout works as well, and names the seat it was waiting for
    eps = run(mrl.play_episodes(Flaky(), tasks, {"agent": scripted(delay=3600)}, timeout=0.2))
    assert all(not e.ok and e.errors[0].startswith(
        "env 'env': episode timed out after 0.2 s, waiting for a reply from 'agent'") for e in eps), eps[0].errors


def test_trace_and_episode_round_trip_through_json(backend):
    agent = Agent(mrl.AgentConfig(sampling={"max_new_tokens": 4}), backend)
    ep = run(Chatter(turns=3).play(mrl.Task(mrl.TaskData(prompt="Hello!", answer="x", info={"k": [1, 2]})),
                                   {"agent": agent}, trainable={"agent": True}, group="g1"))
    ep.traces[0].metrics["m"] = 0.5
    ep.traces[0].streams = mrl.TokenStreams("grpo", advantages=[0.0] * len(ep.traces[0].token_ids))
    back = episode_from_record(json.loads(json.dumps(episode_record(ep))))
    assert back == ep
    assert back.traces[0].reward == ep.traces[0].reward


def test_seed_example_prints_a_reply(capsys):
    async def main():
        agent = mrl.make_agent(mrl.AgentConfig(model="tiny", harness={"id": "chat"}))
        task = mrl.Task(mrl.TaskData(prompt="Find the latest released version of the `verifiers` Python package on PyPI."))
        async with agent:
            trace = await agent.run(task)
        print(trace.last_reply)

    asyncio.run(main())
    out = capsys.readouterr().out
    assert out.strip()


def test_scripted_replies_are_recorded_as_tokens_with_end_of_turn():
    agent = scripted("call")
    trace = run(agent.run(mrl.Task(mrl.TaskData(prompt="hi"))))
    tok = agent.tokenizer
    assert trace.last_reply == "call"
    assert trace.segments[-1].kind == "action" and trace.segments[-1].logprobs is None
    assert tok.decode(trace.segments[-1].token_ids) == "call<|im_end|>"


def test_turn_limit_and_stop_strings(backend):
    agent = Agent(mrl.AgentConfig(harness={"max_turns": 1}, sampling={"max_new_tokens": 3}), backend)

    async def two_turns():
        async with agent.interaction(mrl.Task(mrl.TaskData(prompt="hi"))) as it:
            await it.send()
            await it.send("again")

    with pytest.raises(mrl.TurnLimitReached):
        run(two_turns())
    # a stop string cuts the reply text and marks the finish
    tok = backend.tokenizer
    gens = backend.generate_batch([tok.encode("Hello")] * 4, mrl.SamplingParams(max_new_tokens=30, stop=("e",), seed=1))
    for g in gens:
        text = tok.decode(g.token_ids, skip_special_tokens=True)
        if g.finish_reason == "stop_string":
            assert "e" in text and "e" not in tok.decode(g.token_ids[:-1], skip_special_tokens=True)
        else:
            assert "e" not in text


def test_task_sampling_overrides_apply_to_every_seat(backend):
    agent = Agent(mrl.AgentConfig(sampling={"max_new_tokens": 12, "seed": 3}), backend)
    task = mrl.Task(mrl.TaskData(prompt="Hello!"), sampling={"max_new_tokens": 2})
    it = agent.interaction(task)
    assert it.sampling.max_new_tokens == 2 and it.sampling.seed == 3
    assert agent.interaction(task, max_new_tokens=5).sampling.max_new_tokens == 5  # a call's own override wins
    trace = run(agent.run(task))
    assert 1 <= trace.num_action_tokens <= 2


def test_frozen_backends_are_cached_by_model_and_device():
    import torch

    a = mrl.build_backend("tiny", device="cpu")
    assert mrl.build_backend("tiny", device=torch.device("cpu")) is a
    assert a.supports_choices and a.max_context == 2048 and a.model_id == "tiny"
    with pytest.raises(ValueError, match="model='policy' binds a seat to the live policy"):
        mrl.build_backend("policy")
