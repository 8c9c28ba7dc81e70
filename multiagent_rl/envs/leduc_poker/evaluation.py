"""Exact evaluation of Leduc poker policies through OpenSpiel, and reading a language model's policy.

A policy is a table ``{InfoState: {action word: probability}}`` over the 288 rank-based information states of
[`multiagent_rl.envs.leduc_poker.rules`][]; OpenSpiel's 936 information states (which tell the suits apart) map onto them.
Exploitability is OpenSpiel's (NashConv / 2): 0 at a Nash equilibrium, ~2.37 for uniform random play.
"""

from __future__ import annotations

import functools
from typing import Mapping

import pyspiel
from open_spiel.python.algorithms import exploitability

from ...agents.chat_template import ChatTemplate
from ...games.evaluation import GameEvaluation
from ...games.tables import choice_probabilities, tabular_policy
from . import decision_prompt
from . import rules as leduc
from .rules import AveragePolicy

Table = dict[leduc.InfoState, dict[str, float]]


@functools.lru_cache(maxsize=None)
def _game() -> pyspiel.Game:
    return pyspiel.load_game("leduc_poker")


@functools.lru_cache(maxsize=None)
def openspiel_keys() -> dict[str, leduc.InfoState]:
    """Each of OpenSpiel's information-state strings → our rank-based information state (a walk of its tree)."""
    out: dict[str, leduc.InfoState] = {}

    def walk(state, cards: tuple[str, ...], public, history):
        if state.is_terminal():
            return
        if state.is_chance_node():
            for action, _ in state.chance_outcomes():
                card = leduc.RANKS[action // 2]
                walk(state.child(action), cards + (card,) if len(cards) < 2 else cards,
                     public if len(cards) < 2 else card, history)
            return
        player = state.current_player()
        out[state.information_state_string()] = leduc.InfoState(player, cards[player], public, history)
        for word in leduc.legal_actions(history):
            walk(state.child(leduc.ACTION_IDS[word]), cards, public, leduc.apply(history, word))

    walk(_game().new_initial_state(), (), None, ((), ()))
    return out


def uniform_table() -> Table:
    return {s: {a: 1 / len(legal) for a in legal} for s in leduc.info_states()
            for legal in [leduc.legal_actions(s.history)]}


def exploitability_of(table: Mapping[leduc.InfoState, Mapping[str, float]]) -> float:
    """OpenSpiel's exploitability (NashConv / 2) of ``table`` (rows renormalised over the legal actions).

    ```pycon
    >>> round(exploitability_of(uniform_table()), 3)
    2.374

    ```
    """
    return float(exploitability.exploitability(_game(), tabular_policy(_game(), openspiel_keys(), table,
                                                                       leduc.ACTION_IDS)))


def read_policy(model, tokenizer, batch_size: int = 256) -> Table:
    """The model's policy at all 288 information states, as the legal-action harness plays it, at the exact prompt a
    seat sees (one forward pass per legal word, batched)."""
    template = ChatTemplate(tokenizer)
    items = [(s, template.prompt_ids([{"role": "user", "content": decision_prompt(s)}]), leduc.legal_actions(s.history))
             for s in leduc.info_states()]
    return choice_probabilities(model, template, items, batch_size)


class LeducEvaluation(GameEvaluation):
    """Every ``every`` steps (and at the last): the exploitability of the policy read at all 288 information states
    and of the reach-weighted average of the readings from ``start_step`` on, as ``eval/leduc/...`` metrics and
    `points` ([`GameEvaluation`][multiagent_rl.games.evaluation.GameEvaluation])."""

    name = "leduc"

    def new_average(self) -> AveragePolicy:
        return AveragePolicy()

    def read(self, model, tokenizer) -> Table:
        return read_policy(model, tokenizer)

    def exploitability(self, table) -> float:
        return exploitability_of(table)


def evaluate(model, tokenizer) -> dict[str, float]:
    """The exploitability of a saved model's Leduc policy, read at every information state through the legal-action
    harness (``multiagent-rl eval leduc_poker --model PATH``)."""
    return {"exploitability": exploitability_of(read_policy(model, tokenizer))}
