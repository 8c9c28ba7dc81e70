"""Exact game-theoretic evaluation of Kuhn poker policy tables through OpenSpiel (the ``games`` extra).

All game theory (tree, exploitability, expected values) is delegated to OpenSpiel; this module only
translates [`multiagent_rl.games.kuhn`][] tables to `open_spiel.python.policy.TabularPolicy`.
Exploitability is NashConv / 2: 0 exactly at a Nash equilibrium, ~0.4583 for uniform play.

```pycon
>>> round(exploitability_of(uniform_policy()), 4)
0.4583
>>> exploitability_of(nash_policy(1 / 6)) < 1e-9
True

```
"""

from __future__ import annotations

import functools
from typing import Mapping

import pyspiel
from open_spiel.python import policy as policy_lib
from open_spiel.python.algorithms import expected_game_score, exploitability

from ..games.kuhn import CARDS, INFO_STATES, InfoState, invalid_mass, nash_policy, normalized, uniform_policy
from .tables import tabular_policy

__all__ = ["ACTION_IDS", "openspiel_info_state_strings", "to_openspiel", "exploitability_of", "expected_chips",
           "evaluation_report"]

# OpenSpiel's Kuhn poker has two action ids; their meaning depends on whether the player
# faces a bet: 0 = "Pass" (check or fold), 1 = "Bet" (bet or call).
ACTION_IDS: dict[str, int] = {"check": 0, "fold": 0, "bet": 1, "call": 1}
"""OpenSpiel action id of each of our action words: ``ACTION_IDS["call"] == 1``."""


@functools.lru_cache(maxsize=None)
def _game() -> pyspiel.Game:
    return pyspiel.load_game("kuhn_poker")


@functools.lru_cache(maxsize=None)
def openspiel_info_state_strings() -> dict[InfoState, str]:
    """Map each of our info states to OpenSpiel's ``information_state_string``.

    Found by walking OpenSpiel's game tree (never hard-coded), recording the acting player,
    their dealt card (from the chance outcomes) and the action words played so far; it also
    checks that the mapping is a bijection onto OpenSpiel's 12 info states.

    ```pycon
    >>> openspiel_info_state_strings()[InfoState(1, "J", ("check",))]
    '0p'

    ```
    """
    mapping: dict[InfoState, str] = {}

    def walk(state: pyspiel.State, cards: tuple[int, ...], words: tuple[str, ...]) -> None:
        if state.is_terminal():
            return
        if state.is_chance_node():
            for card, _ in state.chance_outcomes():
                walk(state.child(card), cards + (card,), words)
            return
        player = state.current_player()
        s = InfoState(player, CARDS[cards[player]], words)
        key = state.information_state_string()
        if mapping.setdefault(s, key) != key:
            raise AssertionError(f"{s} maps to two OpenSpiel info states")
        assert sorted(state.legal_actions()) == [ACTION_IDS[a] for a in s.legal_actions]
        for word in s.legal_actions:
            walk(state.child(ACTION_IDS[word]), cards, words + (word,))

    walk(_game().new_initial_state(), (), ())
    if set(mapping) != set(INFO_STATES) or len(set(mapping.values())) != len(INFO_STATES):
        raise AssertionError("OpenSpiel's Kuhn poker tree does not match INFO_STATES")
    return mapping


def to_openspiel(table: Mapping[InfoState, Mapping[str, float]]) -> policy_lib.TabularPolicy:
    """Convert a table to an OpenSpiel ``TabularPolicy`` (rows renormalised over legal actions).

    ```pycon
    >>> pol = to_openspiel(nash_policy(0.0))
    >>> pol.policy_for_key(openspiel_info_state_strings()[InfoState(0, "K", ("check", "bet"))]).tolist()
    [0.0, 1.0]

    ```
    """
    keys = {key: s for s, key in openspiel_info_state_strings().items()}
    return tabular_policy(_game(), keys, {s: normalized(table, s) for s in keys.values()}, ACTION_IDS)


def exploitability_of(table: Mapping[InfoState, Mapping[str, float]]) -> float:
    """OpenSpiel's exploitability (NashConv / 2) of the renormalised table.

    0 exactly at a Nash equilibrium, ~0.4583 for the uniform policy.

    ```pycon
    >>> exploitability_of(nash_policy(0.0)) < 1e-9
    True

    ```
    """
    return float(exploitability.exploitability(_game(), to_openspiel(table)))


def expected_chips(
    table: Mapping[InfoState, Mapping[str, float]],
    opponent: Mapping[InfoState, Mapping[str, float]],
    seat: int,
) -> float:
    """Exact expected chips won by ``seat`` playing ``table`` against ``opponent``.

    Both tables are renormalised; only the rows of the respective seat are used. Computed
    by OpenSpiel's ``expected_game_score.policy_value`` (full enumeration, no sampling).

    ```pycon
    >>> round(expected_chips(nash_policy(1 / 6), nash_policy(1 / 6), seat=0), 6) == round(-1 / 18, 6)
    True

    ```
    """
    if seat not in (0, 1):
        raise ValueError(f"seat must be 0 or 1, got {seat}")
    policies = [to_openspiel(opponent), to_openspiel(opponent)]
    policies[seat] = to_openspiel(table)
    values = expected_game_score.policy_value(_game().new_initial_state(), policies)
    return float(values[seat])


def evaluation_report(table: Mapping[InfoState, Mapping[str, float]]) -> dict[str, float]:
    """All exact metrics of one policy table.

    ``chips_vs_random_pX`` / ``chips_vs_nash_pX``: expected chips when ``table`` sits in
    seat X against the uniform random policy / the Nash policy with ``alpha = 1/6`` (the
    midpoint of the family). Against Nash the best achievable is -1/18 in seat 0 and +1/18
    in seat 1, so these also measure how far below the game value the policy falls.

    ```pycon
    >>> r = evaluation_report(nash_policy(1 / 6))
    >>> sorted(r)
    ['chips_vs_nash_p0', 'chips_vs_nash_p1', 'chips_vs_random_p0', 'chips_vs_random_p1', 'exploitability', 'invalid_mass']

    ```
    """
    rand, nash = uniform_policy(), nash_policy(1 / 6)
    return {
        "exploitability": exploitability_of(table),
        "invalid_mass": invalid_mass(table),
        "chips_vs_random_p0": expected_chips(table, rand, 0),
        "chips_vs_random_p1": expected_chips(table, rand, 1),
        "chips_vs_nash_p0": expected_chips(table, nash, 0),
        "chips_vs_nash_p1": expected_chips(table, nash, 1),
    }
