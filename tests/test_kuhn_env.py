"""Kuhn poker environment: rules against OpenSpiel, re-prompts, forfeits, scripted seats."""

import asyncio
import itertools

import pyspiel
import pytest

import multiagent_rl as mrl
from multiagent_rl.envs import kuhn_poker as kp
from multiagent_rl.envs.kuhn_poker import exploitability as kuhn
from multiagent_rl.envs.kuhn_poker.evaluation import info_state_context
from multiagent_rl.envs.kuhn_poker import rules

SEQUENCES = [("check", "check"), ("check", "bet", "fold"), ("check", "bet", "call"), ("bet", "fold"), ("bet", "call")]


def replaying(actions_by_player, replies_seen):
    """A scripted seat that plays the given actions in order (or any strings, to test invalid replies)."""
    queue = list(actions_by_player)

    def policy(turn):
        replies_seen.append(turn.messages[-1]["content"])
        return queue.pop(0)

    return mrl.make_agent(mrl.AgentConfig(model="scripted", policy=policy))


def play(cards, replies0, replies1, **env_kwargs):
    seen = []
    agents = {"player_0": replaying(replies0, seen), "player_1": replaying(replies1, seen)}
    task = mrl.Task(mrl.TaskData(info={"cards": list(cards)}))
    ep = asyncio.run(kp.KuhnPokerEnv(**env_kwargs).play(task, agents, trainable={"player_0": True, "player_1": True}))
    assert ep.ok, ep.errors
    return ep, seen


def openspiel_returns(cards, sequence):
    game = pyspiel.load_game("kuhn_poker")
    state = game.new_initial_state()
    for card in cards:
        state.apply_action(rules.CARDS.index(card))
    for action in sequence:
        state.apply_action(kuhn.ACTION_IDS[action])
    assert state.is_terminal()
    return state.returns()


@pytest.mark.parametrize("cards", list(itertools.permutations(rules.CARDS, 2)))
@pytest.mark.parametrize("sequence", SEQUENCES)
def test_every_deal_and_sequence_pays_what_openspiel_pays(cards, sequence):
    p0 = [a for i, a in enumerate(sequence) if kp.to_act(sequence[:i]) == 0]
    p1 = [a for i, a in enumerate(sequence) if kp.to_act(sequence[:i]) == 1]
    ep, _ = play(cards, p0, p1)
    t0, t1 = ep.by_role("player_0")[0], ep.by_role("player_1")[0]
    assert [t0.reward, t1.reward] == openspiel_returns(cards, sequence)
    assert t0.info["history"] == list(sequence)
    assert t0.trainable and t1.trainable


def test_prompts_state_card_history_and_legal_actions():
    _, seen = play(("K", "J"), ["check", "call"], ["bet"])
    assert seen[0] == kp.decision_prompt(0, "K", ())
    assert "Your card: K" in seen[0] and "Reply check or bet" in seen[0]
    assert seen[1] == kp.decision_prompt(1, "J", ("check",))
    assert "Bets so far: check, bet. Reply fold or call" in seen[2]


def test_invalid_reply_gets_one_reprompt_then_forfeits():
    ep, seen = play(("Q", "K"), ["raise", "Bet."], ["call"], reply_tokens=4)  # re-prompted, then a valid bet
    assert ep.by_role("player_0")[0].metrics["invalid_replies"] == 1
    assert seen[1] == kp.invalid_prompt(())
    assert ep.by_role("player_0")[0].reward == -2  # lost the showdown for 2 chips

    ep, _ = play(("K", "J"), ["raise", "all in"], [], reply_tokens=4)
    (t0,) = ep.traces  # player 1 never acted, so it has no run to record (and nothing to train)
    assert t0.reward == -2.0 and t0.info["chips"] == [-2.0, 1.0]  # forfeit costs more than any fold
    assert t0.metrics["forfeit"] == 1.0 and t0.metrics["invalid_replies"] == 2
    with pytest.raises(ValueError, match="below -1"):
        kp.KuhnPokerEnv(invalid_penalty=-1.0)


def test_scripted_nash_players_earn_the_game_value():
    import random

    env = kp.KuhnPokerEnv()
    agents = {r: mrl.make_agent(mrl.AgentConfig(model="scripted", policy=kp.nash_policy(1 / 6)))
              for i, r in enumerate(kp.ROLES)}
    tasks = env.sample_tasks(3000, random.Random(0))
    eps = asyncio.run(mrl.play_episodes(env, tasks, agents, seed="0"))
    mean = sum(e.by_role("player_0")[0].reward for e in eps) / len(eps)
    assert abs(mean - rules.NASH_VALUE_P0) < 0.06  # -1/18 ± ~3 standard errors


def test_read_policy_contexts_match_play(tiny):
    """The evaluation reads the model at exactly the tokens a seat sees during play."""
    from multiagent_rl.agents.chat_template import ChatTemplate

    model, tok = tiny
    backend = mrl.TransformersBackend(model, tok)
    contexts = []
    check = tok.encode("check")

    async def always_check(ids, params, messages=None):  # the policy seat: records its context, replies "check"
        contexts.append(list(ids))
        return mrl.Generation(check, [0.0] * len(check), "length")

    backend.generate = always_check
    seat0 = mrl.Agent(mrl.AgentConfig(model="policy"), backend)
    seat1 = mrl.make_agent(mrl.AgentConfig(model="scripted", policy=lambda turn: "bet"))
    task = mrl.Task(mrl.TaskData(info={"cards": ["Q", "K"]}))
    ep = asyncio.run(kp.KuhnPokerEnv().play(task, {"player_0": seat0, "player_1": seat1}))
    assert ep.ok and len(contexts) == 3  # check; facing the bet "check" is invalid -> one re-prompt
    template = ChatTemplate(tok)
    assert contexts[0] == info_state_context(template, rules.InfoState(0, "Q", ()))
    assert contexts[1] == info_state_context(template, rules.InfoState(0, "Q", ("check", "bet")))
