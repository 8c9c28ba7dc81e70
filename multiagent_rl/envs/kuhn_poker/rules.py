"""Kuhn poker, the game itself: rules, information states, strategy tables (no model, no OpenSpiel).

A deck of three cards J < Q < K; each player antes 1 chip and gets one card. Player 0 acts first:
``check`` or ``bet`` (1 chip). After a check, player 1 may ``check`` (showdown for the antes) or
``bet``; facing a bet, a player may ``fold`` (losing the ante) or ``call`` (showdown for 2 chips
each). The higher card wins the showdown. The game's value for player 0 is −1/18.

A policy is a `PolicyTable`: for each of the 12 information states
([`INFO_STATES`][multiagent_rl.envs.kuhn_poker.rules.INFO_STATES]) a distribution over that state's legal action words. A language
model may put probability on replies that are not legal actions, so a row may sum to less than 1;
[`normalized`][multiagent_rl.envs.kuhn_poker.rules.normalized] gives the policy actually played (renormalised over the legal
actions) and [`invalid_mass`][multiagent_rl.envs.kuhn_poker.rules.invalid_mass] the missing mass. The environment
(``multiagent_rl.envs.kuhn_poker``) prompts this game; the evaluation (``multiagent_rl.envs.kuhn_poker.exploitability``) scores tables with
OpenSpiel.

```pycon
>>> payoff(("K", "J"), ("bet", "call"))
(2, -2)
>>> normalized(nash_policy(1 / 6), InfoState(0, "K", ()))
{'check': 0.5, 'bet': 0.5}

```
"""

from __future__ import annotations

import itertools
import math
import random
from typing import Mapping, NamedTuple

from ...games.average import ReachWeightedAverage

CARDS: tuple[str, ...] = ("J", "Q", "K")
"""The deck, lowest first (OpenSpiel's card ids 0, 1, 2)."""

DEALS: tuple[tuple[str, str], ...] = tuple(itertools.permutations(CARDS, 2))
"""(card of player 0, card of player 1): the 6 deals, equally likely."""

UNIFORM_EXPLOITABILITY = 11 / 24
"""Exploitability (NashConv / 2) of the uniform random policy, ~0.4583."""

NASH_VALUE_P0 = -1 / 18
"""Game value of Kuhn poker for player 0 (the first to act) under any Nash equilibrium."""


def legal_actions(history: tuple[str, ...]) -> tuple[str, str]:
    """The two legal action words after ``history``: pass first (check / fold), bet second (bet / call)."""
    return ("fold", "call") if history and history[-1] == "bet" else ("check", "bet")


def to_act(history: tuple[str, ...]) -> int | None:
    """Whose turn it is after ``history``, or None when the hand is over."""
    if history in ((), ("check", "bet")):
        return 0
    if history in (("check",), ("bet",)):
        return 1
    return None


def payoff(cards: tuple[str, str], history: tuple[str, ...]) -> tuple[int, int]:
    """Chips won by each player at the end of a hand."""
    if history[-1] == "fold":
        folder = len(history) % 2 == 0  # fold is the 2nd or 3rd action: 2nd = player 1, 3rd = player 0
        winner = 0 if folder else 1
        return (1, -1) if winner == 0 else (-1, 1)
    stake = 2 if "bet" in history else 1
    winner = 0 if CARDS.index(cards[0]) > CARDS.index(cards[1]) else 1
    return (stake, -stake) if winner == 0 else (-stake, stake)


class InfoState(NamedTuple):
    """An information state: the acting player, their own card and the public history.

    ```pycon
    >>> s = InfoState(1, "Q", ("bet",))
    >>> s.legal_actions
    ('fold', 'call')
    >>> InfoState(0, "K", ()).legal_actions
    ('check', 'bet')

    ```
    """

    player: int
    card: str
    history: tuple[str, ...]

    @property
    def legal_actions(self) -> tuple[str, ...]:
        """Legal action words, pass first, bet second (OpenSpiel's action id order)."""
        return legal_actions(self.history)


# The four decision points of Kuhn poker, in the order they can occur.
_DECISION_POINTS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (0, ()),
    (0, ("check", "bet")),
    (1, ("check",)),
    (1, ("bet",)),
)

INFO_STATES: list[InfoState] = [InfoState(p, c, h) for p, h in _DECISION_POINTS for c in CARDS]
"""All 12 information states, ordered by decision point, then card J, Q, K:
player 0 at ``()``, player 0 at ``("check", "bet")``, player 1 at ``("check",)``,
player 1 at ``("bet",)``.

```pycon
>>> len(INFO_STATES), INFO_STATES[0], INFO_STATES[-1]
(12, InfoState(player=0, card='J', history=()), InfoState(player=1, card='K', history=('bet',)))

```
"""

PolicyTable = dict[InfoState, dict[str, float]]
"""Per info state, probabilities over its legal action words (rows may sum to < 1).

```pycon
>>> table = uniform_policy()
>>> table[InfoState(0, "J", ())]
{'check': 0.5, 'bet': 0.5}

```
"""


# --------------------------------------------------------------------------- tables


def _row(table: Mapping[InfoState, Mapping[str, float]], s: InfoState) -> dict[str, float]:
    """The raw row of ``s``, validated: only legal words, non-negative, sum <= 1."""
    if s not in table:
        raise ValueError(f"policy table has no entry for {s}")
    row = dict(table[s])
    legal = s.legal_actions
    bad = [a for a in row if a not in legal]
    if bad:
        raise ValueError(f"{s}: actions {bad} are not legal (legal: {legal})")
    for a, p in row.items():
        if not (p >= 0.0 and math.isfinite(p)):
            raise ValueError(f"{s}: probability of {a!r} is {p}")
    # Tolerate float rounding from whoever built the table.
    if sum(row.values()) > 1.0 + 1e-6:
        raise ValueError(f"{s}: probabilities sum to {sum(row.values())} > 1")
    return {a: float(row.get(a, 0.0)) for a in legal}


def normalized(table: Mapping[InfoState, Mapping[str, float]], s: InfoState) -> dict[str, float]:
    """The row of ``s`` renormalised over the legal actions (the policy actually played).

    A row with no mass at all on legal actions (the model never produced a valid reply)
    is treated as uniform, since a resampling harness would then fall back to chance.

    ```pycon
    >>> normalized({InfoState(0, "J", ()): {"check": 0.375, "bet": 0.125}}, InfoState(0, "J", ()))
    {'check': 0.75, 'bet': 0.25}

    ```
    """
    row = _row(table, s)
    total = sum(row.values())
    if total <= 0.0:
        return {a: 1.0 / len(row) for a in row}
    return {a: p / total for a, p in row.items()}


def uniform_policy() -> PolicyTable:
    """The uniform random policy (each legal action with probability 1/2).

    ```pycon
    >>> uniform_policy()[InfoState(1, "K", ("bet",))]
    {'fold': 0.5, 'call': 0.5}

    ```
    """
    return {s: {a: 0.5 for a in s.legal_actions} for s in INFO_STATES}


def nash_policy(alpha: float) -> PolicyTable:
    """The standard one-parameter family of Nash equilibria of Kuhn poker (Kuhn, 1950).

    Player 0 bets J with probability ``alpha``, always checks Q, bets K with probability
    ``3 * alpha``; after check-bet it folds J, calls Q with probability ``alpha + 1/3`` and
    always calls K. Player 1 (whose equilibrium strategy is unique) after a check bets J
    with probability 1/3, checks Q, bets K; facing a bet folds J, calls Q with probability
    1/3 and calls K. Valid for ``0 <= alpha <= 1/3``; the value for player 0 is -1/18.

    ```pycon
    >>> nash_policy(1 / 6)[InfoState(0, "K", ())]
    {'check': 0.5, 'bet': 0.5}
    >>> nash_policy(0.5)
    Traceback (most recent call last):
    ...
    ValueError: alpha must be in [0, 1/3], got 0.5

    ```
    """
    # A tiny tolerance so that nash_policy(1/3) works despite float rounding.
    if not (-1e-12 <= alpha <= 1 / 3 + 1e-12):
        raise ValueError(f"alpha must be in [0, 1/3], got {alpha}")
    alpha = min(max(alpha, 0.0), 1 / 3)
    bet = {  # probability of the aggressive action ("bet" or "call") per (decision point, card)
        (0, ()): {"J": alpha, "Q": 0.0, "K": 3 * alpha},
        (0, ("check", "bet")): {"J": 0.0, "Q": alpha + 1 / 3, "K": 1.0},
        (1, ("check",)): {"J": 1 / 3, "Q": 0.0, "K": 1.0},
        (1, ("bet",)): {"J": 0.0, "Q": 1 / 3, "K": 1.0},
    }
    table: PolicyTable = {}
    for s in INFO_STATES:
        p = bet[(s.player, s.history)][s.card]
        passive, aggressive = s.legal_actions
        table[s] = {passive: 1.0 - p, aggressive: p}
    return table


def invalid_mass(table: Mapping[InfoState, Mapping[str, float]]) -> float:
    """Mean over the 12 info states of ``1 - sum(row)``: how much mass went to invalid replies.

    ```pycon
    >>> invalid_mass({s: {a: 0.25 for a in s.legal_actions} for s in INFO_STATES})
    0.5

    ```
    """
    return sum(1.0 - sum(_row(table, s).values()) for s in INFO_STATES) / len(INFO_STATES)


def own_reach(table: Mapping[InfoState, Mapping[str, float]], info_state: InfoState) -> float:
    """Probability that the acting player's own (renormalised) actions lead to ``info_state``.

    Only the player's own earlier actions count (opponent and chance are excluded), which
    is what the average-strategy formula of fictitious play / CFR needs. It is 1 at a
    player's first decision; in Kuhn poker only player 0 at ``("check", "bet")`` has an
    earlier own action (the check).

    ```pycon
    >>> own_reach(nash_policy(1 / 6), InfoState(0, "K", ("check", "bet")))
    0.5
    >>> own_reach(nash_policy(1 / 6), InfoState(1, "J", ("bet",)))
    1.0

    ```
    """
    s = InfoState(*info_state)
    reach = 1.0
    for i, word in enumerate(s.history):
        if i % 2 == s.player:  # players alternate, player 0 acts at even positions
            earlier = InfoState(s.player, s.card, s.history[:i])
            reach *= normalized(table, earlier)[word]
    return reach


class AveragePolicy(ReachWeightedAverage):
    """Reach-weighted average of Kuhn policy snapshots (see [`multiagent_rl.games.average`][]), with
    [`own_reach`][multiagent_rl.envs.kuhn_poker.rules.own_reach] and [`normalized`][multiagent_rl.envs.kuhn_poker.rules.normalized] rows, so
    the average has no invalid mass.

    ```pycon
    >>> avg = AveragePolicy()
    >>> avg.add(nash_policy(0.0)); avg.add(nash_policy(1 / 3))
    >>> len(avg), avg.table()[InfoState(0, "K", ())]
    (2, {'check': 0.5, 'bet': 0.5})

    ```
    """

    def __init__(self) -> None:
        super().__init__(
            INFO_STATES, lambda s: s.legal_actions, own_reach, normalized,
            encode=lambda s: {"player": s.player, "card": s.card, "history": list(s.history)},
            decode=lambda e: InfoState(int(e["player"]), str(e["card"]), tuple(e["history"])),
        )


def sample_action(table: Mapping[InfoState, Mapping[str, float]], player: int, card: str,
                  history: tuple[str, ...], rng: random.Random) -> str:
    """Draw an action at ``(player, card, history)`` from the table's (renormalised) row."""
    row = normalized(table, InfoState(player, card, tuple(history)))
    actions = list(row)
    return rng.choices(actions, weights=[row[a] for a in actions])[0]
