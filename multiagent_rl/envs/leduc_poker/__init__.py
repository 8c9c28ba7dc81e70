"""Leduc poker as an environment: two betting rounds and a public card, for self-play at a larger scale than Kuhn.

The rules live in [`multiagent_rl.envs.leduc_poker.rules`][]. Each decision is its own one-turn conversation whose prompt
states the whole information state (the seat's card, the public card once turned, both rounds' betting, the legal
actions), so the policy at an information state is exactly the model's reply distribution to one prompt (read in
one batch by [`multiagent_rl.envs.leduc_poker.evaluation`][]), and every decision is a trace of the seat rewarded with the hand's
chips. Replies go through the legal-action harness (constrained to the legal words). Reward = chips won.
"""

from __future__ import annotations

import random
from typing import Callable, Mapping

from ...tasks.task import Task, TaskData
from ..base import Env
from ..registry import register_env
from . import rules as leduc

ROLES = ("player_0", "player_1")
DECK = tuple(r for r in leduc.RANKS for _ in range(2))


def decision_prompt(state: leduc.InfoState) -> str:
    """What a seat is told before a decision (the card last, as in Kuhn: the word small models find most easily)."""
    player, card, public, (first, second) = state
    rounds = f"Round 1 bets: {', '.join(first) or 'none'}."
    if public is not None:
        rounds += f" Public card: {public}. Round 2 bets: {', '.join(second) or 'none'}."
    legal = leduc.legal_actions((first, second))
    return f"Leduc poker, player {player}. {rounds} Reply {' or '.join(legal)}. Your card: {card}."


@register_env("leduc_poker")
class LeducPokerEnv(Env):
    """Two seats, ``player_0`` and ``player_1``; a task is one deal (two private cards and the public card)."""

    name = "leduc_poker"
    roles = ROLES

    def __init__(self, reply_tokens: int = 4):
        self.reply_tokens = reply_tokens

    def sample_tasks(self, num: int, rng: random.Random) -> list[Task]:
        return [Task(TaskData(info={"cards": rng.sample(DECK, 3)})) for _ in range(num)]

    async def run(self, task: Task, agents) -> None:
        *cards, public = task.data.info["cards"]
        history: leduc.History = ((), ())
        traces: list[list] = [[], []]
        while (player := leduc.to_act(history)) is not None:
            shown = public if leduc.current_round(history) == 1 else None
            state = leduc.InfoState(player, cards[player], shown, history)
            decision = Task(TaskData(prompt=decision_prompt(state)))
            async with agents[ROLES[player]].interaction(decision, max_new_tokens=self.reply_tokens) as it:
                action = await it.send(state={"info_state": state}, choices=leduc.legal_actions(history))
            traces[player].append(it.trace)
            history = leduc.apply(history, action)
        chips = leduc.payoff(tuple(cards), public, history)
        for player in (0, 1):
            for trace in traces[player]:
                trace.add_reward("chips", chips[player])
                trace.info.update(cards=list(cards), public=public, history=[list(r) for r in history])


def table_policy(table: Mapping[leduc.InfoState, Mapping[str, float]]) -> Callable:
    """Play a tabular policy ``{InfoState: {action: prob}}`` (the tables of
    [`multiagent_rl.envs.leduc_poker.evaluation`][]), drawing from the seat's own random stream."""

    def act(turn) -> str:
        row = table[turn.state["info_state"]]
        return turn.rng.choices(list(row), weights=list(row.values()))[0]

    return act


def random_mixed_table(seed: int = 0, low: float = 0.1, high: float = 0.9) -> dict:
    """At each information state, P(the aggressive action) is ``low`` or ``high`` (drawn with ``seed``); the rest
    goes to the passive ones."""
    table = {}
    rng = random.Random(seed)
    for s in leduc.info_states():
        legal = leduc.legal_actions(s.history)
        bold = rng.choice((low, high))
        aggressive = "raise" if "raise" in legal else "bet" if "bet" in legal else "call"
        rest = [a for a in legal if a != aggressive]
        table[s] = {aggressive: bold, **{a: (1 - bold) / len(rest) for a in rest}}
    return table


def random_mixed_policy(seed: int = 0, low: float = 0.1, high: float = 0.9):
    """Play [`random_mixed_table`][multiagent_rl.envs.leduc_poker.random_mixed_table] (a warm-up teacher, as for
    Kuhn)."""
    return table_policy(random_mixed_table(seed, low, high))


def uniform_policy():
    return lambda turn: turn.rng.choice(turn.choices)
