"""Kuhn poker as an environment: the smallest poker game with a known equilibrium, for self-play.

The rules live in [`multiagent_rl.envs.kuhn_poker.rules`][] (three cards J < Q < K, ante 1, player 0 acts
first, check / bet, then fold / call facing a bet; the higher card wins the showdown). Each
decision is one turn of the seat's own conversation: the prompt states its private card, the
betting so far and its legal actions, and the reply's first word is the action. An invalid reply
gets one re-prompt; a second invalid reply forfeits the hand: the seat gets ``invalid_penalty``
(default -2, worse than any fold, so the policy is never better off babbling than folding) and
the opponent wins its ante (+1). Reward = chips won by the seat, or with ``reward="unit"`` the
chips mapped affinely onto [0, 1], (chips + 2) / 4, for algorithms that need rewards in [0, 1]
(``max_rl``); an affine map of a zero-sum game's payoffs keeps its equilibria.
"""

from __future__ import annotations

import contextlib
import random
from typing import Any

from ...tasks.task import Task, TaskData
from ..base import Env
from ..registry import register_env
from .rules import DEALS, INFO_STATES, legal_actions, payoff, sample_action, to_act
from .rules import nash_policy as nash_table

ROLES = ("player_0", "player_1")


def decision_prompt(player: int, card: str, history: tuple[str, ...]) -> str:
    """What a seat is told before each decision. The card comes last: it is the one word that
    changes between otherwise identical prompts, and small models find it most easily there."""
    so_far = ", ".join(history) if history else "none"
    first, second = legal_actions(history)
    return f"Kuhn poker, player {player}. Bets so far: {so_far}. Reply {first} or {second}. Your card: {card}."


def invalid_prompt(history: tuple[str, ...]) -> str:
    first, second = legal_actions(history)
    return f"Invalid reply. Reply {first} or {second}."


def parse_action(reply: str, history: tuple[str, ...]) -> str | None:
    words = reply.strip().lower().split()
    word = words[0].strip(".,!?:;\"'`") if words else ""
    return word if word in legal_actions(history) else None


@register_env("kuhn_poker")
class KuhnPokerEnv(Env):
    """Two seats, ``player_0`` and ``player_1``; a task is one deal.

    ``reply_tokens`` bounds each free-text reply (1 suits the embedded tiny model, whose
    vocabulary has every action as one token; use ~4 with a real model).

    ``legal_choices=True`` uses the legal-action harness instead of free text: each reply is
    constrained to the two legal action words (``Interaction.send(..., choices=...)``), sampled
    from the softmax over just their tokens and scored with that same softmax in the loss. The
    game and the prompts are unchanged; what changes is that the policy can no longer reply
    invalidly, so the re-prompt and forfeit never happen and the policy at each information
    state is exactly the model's renormalised probability of the two legal words.
    """

    name = "kuhn_poker"
    roles = ROLES

    def __init__(self, invalid_penalty: float = -2.0, reply_tokens: int = 1, legal_choices: bool = False,
                 reward: str = "chips"):
        if invalid_penalty >= -1:
            raise ValueError(f"invalid_penalty={invalid_penalty} must be below -1 (a fold), or babbling beats folding")
        if reward not in ("chips", "unit"):
            raise ValueError(f"reward={reward!r}: use 'chips' (chips won) or 'unit' ((chips + 2) / 4, in [0, 1])")
        if reward == "unit" and invalid_penalty < -2:
            raise ValueError(f"reward='unit' maps chips in [-2, 2]; invalid_penalty={invalid_penalty} is below -2")
        self.invalid_penalty = invalid_penalty
        self.reply_tokens = reply_tokens
        self.legal_choices = legal_choices
        self.reward = reward

    def sample_tasks(self, num: int, rng: random.Random) -> list[Task]:
        return [Task(TaskData(info={"cards": list(rng.choice(DEALS))})) for _ in range(num)]

    async def run(self, task: Task, agents) -> None:
        cards = tuple(task.data.info["cards"])
        async with contextlib.AsyncExitStack() as stack:  # each seat's trace joins the episode on exit, even on error
            seats = [
                await stack.enter_async_context(agents[role].interaction(task, max_new_tokens=self.reply_tokens))
                for role in ROLES
            ]
            history: tuple[str, ...] = ()
            invalid = [0, 0]
            forfeit: int | None = None
            while (player := to_act(history)) is not None:
                seat = seats[player]
                state = {"player": player, "card": cards[player], "history": history}
                choices = legal_actions(history) if self.legal_choices else None
                reply = await seat.send(decision_prompt(player, cards[player], history), state=state, choices=choices)
                action = parse_action(reply, history)
                if action is None:
                    invalid[player] += 1
                    action = parse_action(await seat.send(invalid_prompt(history), state=state), history)
                if action is None:
                    invalid[player] += 1
                    forfeit = player
                    break
                history += (action,)
            if forfeit is None:
                chips = payoff(cards, history)
            else:
                chips = tuple(self.invalid_penalty if p == forfeit else 1.0 for p in (0, 1))
            for player, seat in enumerate(seats):
                if self.reward == "unit":
                    seat.trace.add_reward("unit_chips", (chips[player] + 2) / 4)
                else:
                    seat.trace.add_reward("chips", chips[player])
                seat.trace.metrics.update(invalid_replies=invalid[player], forfeit=float(forfeit == player))
                seat.trace.info.update(card=cards[player], history=list(history), chips=list(chips))


# -- scripted opponents --------------------------------------------------------------------------
# They draw their random moves from ``turn.rng``, the stream the episode gives each seat, so a
# scripted opponent's moves are reproducible from the run's seed and resume exactly.


def random_policy():
    """Uniformly random legal actions (exploitability 0.458)."""
    return lambda turn: turn.rng.choice(legal_actions(turn.state["history"]))


def table_policy(table: dict[Any, dict[str, float]]):
    """Play a tabular policy ``{InfoState: {action: prob}}`` (see [`multiagent_rl.envs.kuhn_poker.rules`][])."""

    def act(turn) -> str:
        s = turn.state
        return sample_action(table, s["player"], s["card"], s["history"], turn.rng)

    return act


def random_mixed_table(seed: int = 0, low: float = 0.1, high: float = 0.9, two_point: bool = False) -> dict:
    """The table of [`random_mixed_policy`][multiagent_rl.envs.kuhn_poker.random_mixed_policy]: information state →
    action → probability."""
    rng = random.Random(seed)
    table = {}
    for s in INFO_STATES:
        aggressive = rng.choice((low, high)) if two_point else rng.uniform(low, high)
        passive, bold = s.legal_actions  # (check, bet) or (fold, call)
        table[s] = {passive: 1 - aggressive, bold: aggressive}
    return table


def random_mixed_policy(seed: int = 0, low: float = 0.1, high: float = 0.9, two_point: bool = False):
    """A random mixed strategy with its own P(bet or call) at each information state.

    P is drawn (with ``seed``) from U[low, high], or from {low, high} with ``two_point``. No game knowledge: a
    warm-up teacher (via ``sft``) that fixes the reply format and makes the policy condition on
    its card, which a single uniform strategy would not. The further apart the states' strategies,
    the stronger the signal to look at the card: the 64-wide tiny model picks it up in ~75 sft
    steps with ``two_point`` and {0.1, 0.9}, and not within 200 steps with U[0.1, 0.9].
    """
    return table_policy(random_mixed_table(seed, low, high, two_point))


def nash_policy(alpha: float = 1 / 6):
    """A Nash equilibrium policy of the one-parameter family, alpha in [0, 1/3]."""
    return table_policy(nash_table(alpha))
