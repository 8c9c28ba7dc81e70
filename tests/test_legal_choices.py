"""The legal-action harness: replies constrained to choices, sampled and scored with one restricted softmax.

Oracles: a fresh forward pass of the model (softmax over just the allowed ids), empirical sampling
frequencies, OpenSpiel's payoffs (the rules do not change), and the gradient of the loss written
directly on unpadded sequences.
"""

from __future__ import annotations

import asyncio
import copy
import json
import math

import pytest
import torch

import multiagent_rl as mrl
from multiagent_rl.agents.agent import Agent, AgentConfig
from multiagent_rl.envs.base import play_episodes, run_sync
from multiagent_rl.envs import kuhn_poker as kp
from multiagent_rl.backends.scoring import token_logprobs
from multiagent_rl.tasks.task import Task, TaskData
from multiagent_rl.episodes.records import episode_from_record, episode_record

from test_kuhn_env import SEQUENCES, openspiel_returns  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


async def gather(*coros):
    return await asyncio.gather(*coros)


@torch.no_grad()
def restricted_logps(model, context: list[int], continuation: list[int], allowed: list[list[int]]) -> list[float]:
    """log of the softmax over ``allowed[j]`` of the next-token logits, for each continuation token (plain forward)."""
    logits = model(torch.tensor([context + continuation])).logits[0].float()
    out = []
    for j, (token, ids) in enumerate(zip(continuation, allowed)):
        row = logits[len(context) + j - 1]
        out.append((row[token] - torch.logsumexp(row[ids], -1)).item())
    return out


def test_constrained_replies_are_choices_with_restricted_logprobs(backend, tiny):
    model, tok = tiny
    agent = Agent(AgentConfig(model="policy"), backend)
    eos = tok.eos_token_id
    # two choices that share their first token: the first step is forced, the second is sampled
    choice_sets = [("check", "bet"), ("check", "check check", "bet bet")]

    async def one(choices, seed):
        async with agent.interaction(Task(TaskData(prompt="Kuhn poker, player 0. Your card: K."))) as it:
            reply = await it.send(choices=choices, seed=seed)
        return reply, it.trace

    for choices in choice_sets:
        results = run_sync(gather(*(one(choices, s) for s in range(12))))
        options = agent.template.choice_ids(choices)
        for reply, trace in results:
            assert reply in choices
            action = trace.segments[-1]
            assert action.kind == "action" and action.token_ids == options[reply] and action.token_ids[-1] == eos
            context = trace.token_ids[: trace.prompt_length]
            want = restricted_logps(model, context, action.token_ids, action.allowed)
            for ids, got, expected in zip(action.allowed, action.logprobs, want):
                if len(ids) == 1:
                    assert got == 0.0 and abs(expected) < 1e-6  # forced: probability 1 under the restriction
                else:
                    assert abs(got - expected) < 1e-4
    # "check" and "check check" share a token: the continuation after it offers the end of turn or " check"
    options = agent.template.choice_ids(choice_sets[1])
    assert options["check"][0] == options["check check"][0]


def test_constrained_sampling_follows_the_restricted_probabilities(backend, tiny):
    model, tok = tiny
    agent = Agent(AgentConfig(model="policy"), backend)
    task = Task(TaskData(prompt="Kuhn poker, player 1. Bets so far: bet. Reply fold or call. Your card: Q."))
    n = 600

    async def one():
        async with agent.interaction(task) as it:
            return await it.send(choices=("fold", "call"))

    torch.manual_seed(0)
    replies = run_sync(gather(*(one() for _ in range(n))))
    context = agent.template.prompt_ids([{"role": "user", "content": task.data.prompt}])
    ids = [agent.template.encode("fold")[0], agent.template.encode("call")[0]]
    p_call = math.exp(restricted_logps(model, context, [ids[1]], [ids])[0])
    freq = replies.count("call") / n
    assert abs(freq - p_call) < 4 * math.sqrt(p_call * (1 - p_call) / n) + 1e-3, (freq, p_call)
    assert set(replies) <= {"fold", "call"} and backend.num_generate_calls < n  # batched across episodes


def test_allowed_token_ids_also_bind_multi_token_generation(backend, tiny):
    model, tok = tiny
    allowed = tuple(sorted({tok.convert_tokens_to_ids(t) for t in ("check", "bet")} | {tok.eos_token_id}))
    prompt = tok.encode("Hello there")
    gens = backend.generate_batch([prompt] * 6, mrl.SamplingParams(max_new_tokens=5, allowed_token_ids=allowed, seed=3))
    for g in gens:
        assert set(g.token_ids) <= set(allowed)
        want = restricted_logps(model, prompt, g.token_ids, [list(allowed)] * len(g.token_ids))
        assert max(abs(a - b) for a, b in zip(g.logprobs, want)) < 1e-4
    with pytest.raises(ValueError, match="at least one token"):
        mrl.SamplingParams(allowed_token_ids=())


def test_choices_that_cannot_be_told_apart_are_rejected(backend):
    agent = Agent(AgentConfig(model="policy"), backend)
    template = copy.copy(agent.template)
    template._choice_cache = {}
    template.eos_text = ""  # a template without an end-of-turn token: "check" is a prefix of "check check"
    with pytest.raises(ValueError, match="prefix"):
        template.choice_ids(("check", "check check"))


@pytest.mark.parametrize("cards", [("K", "J"), ("J", "Q")])
@pytest.mark.parametrize("sequence", SEQUENCES)
def test_rules_are_unchanged_under_legal_choices(cards, sequence):
    p0 = [a for i, a in enumerate(sequence) if kp.to_act(sequence[:i]) == 0]
    p1 = [a for i, a in enumerate(sequence) if kp.to_act(sequence[:i]) == 1]
    offered = []

    def seat(actions):
        queue = list(actions)

        def policy(turn):
            offered.append(turn.choices)
            return queue.pop(0)

        return mrl.make_agent(mrl.AgentConfig(model="scripted", policy=policy))

    task = mrl.Task(mrl.TaskData(info={"cards": list(cards)}))
    ep = asyncio.run(kp.KuhnPokerEnv(legal_choices=True).play(task, {"player_0": seat(p0), "player_1": seat(p1)}))
    assert ep.ok, ep.errors
    assert [ep.by_role(r)[0].reward for r in kp.ROLES] == openspiel_returns(cards, sequence)
    assert offered == [kp.legal_actions(sequence[:i]) for i in range(len(sequence))]


def test_a_scripted_reply_outside_the_choices_fails_the_episode_with_a_clear_error():
    bad = mrl.make_agent(mrl.AgentConfig(model="scripted", policy=lambda turn: "raise"))
    task = mrl.Task(mrl.TaskData(info={"cards": ["K", "J"]}))
    ep = asyncio.run(kp.KuhnPokerEnv(legal_choices=True).play(task, {"player_0": bad, "player_1": bad}))
    assert not ep.ok and "not one of the choices" in ep.errors[0]


def _kuhn_trainer(fixed_trainer, tmp_path, tiny, episodes, **kw):
    experiment = {"algo": {"type": "grpo"}, "env": [{"id": "kuhn_poker", "args": {"legal_choices": True}}]}
    return fixed_trainer(tmp_path / "run", tiny, experiment, episodes, **kw)


def _played_kuhn_episodes(backend):
    agent = Agent(AgentConfig(model="policy"), backend)
    torch.manual_seed(1)
    episodes = []
    for g, cards in enumerate([("J", "K"), ("Q", "J"), ("K", "Q")]):
        task = Task(TaskData(info={"cards": list(cards)}))
        group = run_sync(play_episodes(kp.KuhnPokerEnv(legal_choices=True), [task],
                                       {"player_0": agent, "player_1": agent}, group_size=6,
                                       trainable={"player_0": True, "player_1": True}))
        for k, ep in enumerate(group):
            ep.id, ep.group, ep.env = f"g{g}-{k}", f"g{g}", "kuhn_poker"
        episodes += group
    return episodes


@pytest.mark.parametrize("entropy_coef", [0.0, 0.3])
def test_loss_scores_constrained_tokens_as_they_were_sampled(tmp_path, tiny, backend, entropy_coef, loss_and_grads,
                                                            grad_checks, fixed_trainer):
    """Collated Kuhn traces under the harness: the trainer's logprobs equal the sampling ones, forced
    end-of-turn tokens carry no weight, and the gradient equals the directly written restricted PG loss
    (minus the entropy bonus over the legal words, when it is on)."""
    max_grad, max_grad_diff = grad_checks
    episodes = _played_kuhn_episodes(backend)
    assert all(ep.ok for ep in episodes)
    assert all(t.metrics["invalid_replies"] == 0 for ep in episodes for t in ep.traces)
    regulariser = [{"type": "entropy", "coef": entropy_coef}] if entropy_coef else []
    trainer = _kuhn_trainer(fixed_trainer, tmp_path, tiny, episodes, regulariser=regulariser)
    batch = trainer._generate_and_score_completions(None)
    assert "allowed_ids" in batch
    # one decision token per reply counts (zero advantages included); the forced end-of-turn token does not
    decisions = sum(
        len(s.token_ids) // 2 for ep in trainer.rollout.last_episodes for t in ep.traces if t.streams
        for s in t.segments if s.kind == "action"
    )
    assert batch["rl_mask"].sum().item() == batch["num_rl_tokens"].item() == decisions > 0

    model = trainer.model
    with torch.no_grad():
        scored = trainer.scorer.score(model, batch, compute_entropy=True)
        logps, entropies = scored.logps, scored.entropies
    decision = (batch["allowed_ids"] >= 0).sum(-1) > 1
    torch.testing.assert_close(logps[decision], batch["sampling_logps"][decision], atol=1e-4, rtol=0)
    p = logps[decision].exp()
    torch.testing.assert_close(entropies[decision], -(p * p.log() + (1 - p) * (1 - p).log()), atol=1e-5, rtol=0)

    loss, grads = loss_and_grads(trainer, batch)
    assert torch.isfinite(loss) and max_grad(grads) > 0
    # the same loss written directly: -Σ A · log π_restricted(a | s) / N over the decision tokens
    direct = copy.deepcopy(tiny[0]).train().requires_grad_(True)  # same weights; TRL patched the trainer's forward
    total = 0.0
    for ep in trainer.rollout.last_episodes:
        for t in ep.traces:
            if not t.streams:
                continue
            full = torch.log_softmax(direct(torch.tensor([t.token_ids])).logits[0].float(), -1)
            for j, (token, allowed, a) in enumerate(zip(t.token_ids, t.allowed_token_ids, t.streams.advantages)):
                if allowed is not None and len(allowed) > 1:
                    restricted = torch.log_softmax(full[j - 1, allowed], -1)
                    total = total - a * restricted[allowed.index(token)]
                    total = total - entropy_coef * -(restricted.exp() * restricted).sum()
    (total / decisions).backward()
    want = {n: q.grad for n, q in direct.named_parameters() if q.grad is not None}
    assert max_grad_diff(grads, want) < 1e-5


def test_teacher_scoring_and_json_keep_the_allowed_ids(backend, tiny):
    model, _ = tiny
    (ep, *_) = _played_kuhn_episodes(backend)
    trace = ep.traces[0]
    scores = token_logprobs(model, [trace.token_ids], allowed=[trace.allowed_token_ids])[0]
    for j, (allowed, lp) in enumerate(zip(trace.allowed_token_ids, trace.sampling_logprobs)):
        if allowed is not None:
            assert abs(scores[j] - lp) < 1e-4  # restricted like the sampling, forced tokens at 0
    back = episode_from_record(json.loads(json.dumps(episode_record(ep))))
    assert back == ep and back.traces[0].allowed_token_ids == trace.allowed_token_ids


def test_read_policy_under_the_harness_is_the_policy_played(backend, tiny):
    """Every sampled decision's probability equals the evaluation's table entry for its information state
    (so the exploitability is computed from exactly the policy that plays)."""
    from multiagent_rl.envs.kuhn_poker.evaluation import read_policy
    from multiagent_rl.envs.kuhn_poker.rules import InfoState

    model, tok = tiny
    table = read_policy(model, tok, legal_choices=True)
    assert all(abs(sum(row.values()) - 1) < 1e-6 for row in table.values())
    checked = 0
    for ep in _played_kuhn_episodes(backend):
        for trace in ep.traces:
            player = kp.ROLES.index(trace.role)
            history = tuple(trace.info["history"])
            seen = [history[:i] for i in range(len(history)) if kp.to_act(history[:i]) == player]
            decisions = [s for s in trace.segments if s.kind == "action"]
            assert len(decisions) == len(seen)
            for before, segment in zip(seen, decisions):
                action = history[len(before)]
                state = InfoState(player, trace.info["card"], before)
                assert abs(math.exp(segment.logprobs[0]) - table[state][action]) < 1e-4
                checked += 1
    assert checked > 40
