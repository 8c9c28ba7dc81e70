"""Leduc poker, the game itself: rules and information states (no model, no OpenSpiel), equal to OpenSpiel's
``leduc_poker`` (tests/test_leduc.py checks every deal and a large sample of action sequences).

Six cards, two each of J < Q < K. Each player antes 1 chip and gets one private card. Two betting rounds, player
0 first in each: ``check`` / ``bet`` when nothing is owed, ``fold`` / ``call`` / ``raise`` when facing a bet (a bet
or raise is 2 chips in round 1, 4 in round 2; at most two per round). A round ends when a bet is called or both
players check. Between the rounds one public card is turned. At the showdown a private card that pairs the public
card wins, else the higher card; equal ranks split the pot. A fold loses what the folder put in.

A history is a tuple of two tuples of action words (round 1, round 2). Words map to OpenSpiel's action ids as
``fold`` 0, ``check``/``call`` 1, ``bet``/``raise`` 2.

```pycon
>>> h = (("bet", "call"), ("check", "bet", "fold"))  # player 0 folds in round 2, after 3 chips each
>>> payoff(("K", "J"), "Q", h)
(-3, 3)
>>> legal_actions((("bet",), ()))
('fold', 'call', 'raise')

```
"""

from __future__ import annotations

import itertools
from typing import Mapping, NamedTuple

from ...games.average import ReachWeightedAverage

RANKS: tuple[str, ...] = ("J", "Q", "K")
"""Card ranks, lowest first; OpenSpiel's card id c has rank ``RANKS[c // 2]``."""
RAISE_SIZE = (2, 4)
"""Chips a bet or raise adds in round 1 and round 2."""
MAX_RAISES = 2
ACTION_IDS: dict[str, int] = {"fold": 0, "check": 1, "call": 1, "bet": 2, "raise": 2}

History = tuple[tuple[str, ...], tuple[str, ...]]


class InfoState(NamedTuple):
    """What the player to act knows: its seat, its card, the public card (None in round 1), the betting so far."""

    player: int
    card: str
    public: str | None
    history: History


def _owed(actions: tuple[str, ...]) -> bool:
    return bool(actions) and actions[-1] in ("bet", "raise")


def _raises(actions: tuple[str, ...]) -> int:
    return sum(a in ("bet", "raise") for a in actions)


def round_over(actions: tuple[str, ...]) -> bool:
    """Whether a round's betting is finished (a call, a fold, or two checks)."""
    return bool(actions) and (actions[-1] in ("call", "fold") or actions[-2:] == ("check", "check"))


def current_round(history: History) -> int:
    return 0 if not round_over(history[0]) or history[0][-1] == "fold" else 1


def legal_actions(history: History) -> tuple[str, ...]:
    """The legal action words for the player to act (in OpenSpiel's action order)."""
    actions = history[current_round(history)]
    if _owed(actions):
        return ("fold", "call", "raise") if _raises(actions) < MAX_RAISES else ("fold", "call")
    return ("check", "bet")


def to_act(history: History) -> int | None:
    """Whose turn it is (player 0 opens each round), or None when the hand is over."""
    if is_over(history):
        return None
    return len(history[current_round(history)]) % 2


def is_over(history: History) -> bool:
    first, second = history
    return (bool(first) and first[-1] == "fold") or round_over(second)


def apply(history: History, action: str) -> History:
    """``history`` after the player to act plays ``action`` (refused unless legal)."""
    if is_over(history) or action not in legal_actions(history):
        raise ValueError(f"{action!r} is not legal after {history}")
    r = current_round(history)
    return (history[0] + (action,), history[1]) if r == 0 else (history[0], history[1] + (action,))


def contributions(history: History) -> tuple[int, int]:
    """Chips each player has put in (antes included)."""
    put = [1, 1]
    for r, actions in enumerate(history):
        owed = [0, 0]
        for i, a in enumerate(actions):
            p = i % 2
            if a == "call":
                put[p] += owed[p]
                owed = [0, 0]
            elif a in ("bet", "raise"):
                put[p] += owed[p] + RAISE_SIZE[r]
                owed = [0, 0]
                owed[1 - p] = RAISE_SIZE[r]
    return put[0], put[1]


def payoff(cards: tuple[str, str], public: str | None, history: History) -> tuple[int, int]:
    """Chips won by each player at the end of a hand."""
    put = contributions(history)
    for actions in history:
        if actions and actions[-1] == "fold":
            folder = (len(actions) - 1) % 2
            return (-put[0], put[0]) if folder == 0 else (put[1], -put[1])
    strength = [(c == public, RANKS.index(c)) for c in cards]
    if strength[0] == strength[1]:
        return (0, 0)
    winner = 0 if strength[0] > strength[1] else 1
    return (put[1], -put[1]) if winner == 0 else (-put[0], put[0])


def info_states() -> list[InfoState]:
    """Every information state at which some player acts (936 of them)."""
    out: set[InfoState] = set()

    def walk(history: History, cards: tuple[str, str], public: str | None) -> None:
        player = to_act(history)
        if player is None:
            return
        if current_round(history) == 1 and public is None:
            for p in RANKS:
                walk(history, cards, p)
            return
        out.add(InfoState(player, cards[player], public, history))
        for a in legal_actions(history):
            walk(apply(history, a), cards, public)

    for cards in itertools.product(RANKS, repeat=2):
        walk(((), ()), cards, None)
    return sorted(out, key=lambda s: (s.player, s.card, s.public or "", s.history))


def normalized(table: Mapping[InfoState, Mapping[str, float]], s: InfoState) -> dict[str, float]:
    """The row of ``s`` renormalised (uniform when it has no mass)."""
    row = table[s]
    total = sum(row.values())
    return {a: p / total for a, p in row.items()} if total > 0 else {a: 1 / len(row) for a in row}


def own_reach(table: Mapping[InfoState, Mapping[str, float]], s: InfoState) -> float:
    """The probability that the player of ``s`` plays the actions that lead to ``s`` (its own share of the reach)."""
    reach, history = 1.0, ((), ())
    for r, actions in enumerate(s.history):
        for i, action in enumerate(actions):
            if i % 2 == s.player:
                reach *= normalized(table, InfoState(s.player, s.card, s.public if r == 1 else None, history))[action]
            history = apply(history, action)
    return reach


class AveragePolicy(ReachWeightedAverage):
    """Reach-weighted average of Leduc policy snapshots (see [`multiagent_rl.games.average`][])."""

    def __init__(self) -> None:
        super().__init__(
            info_states(), lambda s: legal_actions(s.history), own_reach, normalized,
            encode=lambda s: {"player": s.player, "card": s.card, "public": s.public,
                              "history": [list(r) for r in s.history]},
            decode=lambda e: InfoState(int(e["player"]), str(e["card"]), e["public"],
                                       tuple(tuple(r) for r in e["history"])),
        )
