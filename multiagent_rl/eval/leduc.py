"""Exact evaluation of Leduc poker policies through OpenSpiel, and reading a language model's policy.

A policy is a table ``{InfoState: {action word: probability}}`` over the 288 rank-based information states of
[`multiagent_rl.games.leduc`][]; OpenSpiel's 936 information states (which tell the suits apart) map onto them.
Exploitability is OpenSpiel's (NashConv / 2): 0 at a Nash equilibrium, ~2.37 for uniform random play.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Mapping

import pyspiel
from open_spiel.python.algorithms import exploitability
from transformers import TrainerCallback

from ..chat_template import ChatTemplate
from ..envs.leduc_poker import decision_prompt
from ..games import leduc
from ..games.leduc import AveragePolicy
from .tables import choice_probabilities, tabular_policy

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


class LeducEvaluation(TrainerCallback):
    """Every ``every`` steps (and at the last): the policy read at all information states, the exploitability of
    it and of the reach-weighted average of the readings from ``start_step`` on (linear weights), as
    ``eval/leduc/...`` metrics and `points`. Its state travels in checkpoints."""

    def __init__(self, every: int, start_step: int = 0):
        self.every, self.start_step = every, start_step
        self.average = AveragePolicy()
        self.points: list[dict] = []
        self.trainer = None
        self.started = time.time()

    def state_dict(self) -> dict[str, Any]:
        return {"average": self.average.state_dict(), "points": self.points, "seconds": time.time() - self.started}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.average.load_state_dict(state["average"])
        self.points = list(state["points"])
        self.started = time.time() - float(state["seconds"])

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        if step % self.every and step != state.max_steps:
            return
        trainer = self.trainer
        table = read_policy(trainer.accelerator.unwrap_model(trainer.model), trainer.tokenizer)
        if step >= self.start_step:
            self.average.add(table, weight=len(self.average) + 1)
        point = {"step": step, "episodes": trainer.rollout.episodes_played,
                 "seconds": round(time.time() - self.started, 1), "exploitability": exploitability_of(table),
                 "avg_exploitability": exploitability_of(self.average.table()) if len(self.average) else None}
        self.points.append(point)
        for key in ("exploitability", "avg_exploitability"):
            if point[key] is not None:
                trainer.record_metric(f"eval/leduc/{key}", point[key])
