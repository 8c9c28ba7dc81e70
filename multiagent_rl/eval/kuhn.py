"""Exact game-theoretic evaluation of Kuhn poker policies (no language-model code here).

Kuhn poker: a three-card deck J < Q < K (OpenSpiel card ids 0, 1, 2), each player antes 1
chip and is dealt one card, player 0 acts first, a bet is 1 chip. Not facing a bet a
player may ``check`` or ``bet``; facing a bet a player may ``fold`` or ``call``.

A policy is a :data:`PolicyTable`: for each of the 12 information states
(:data:`INFO_STATES`) a distribution over that state's legal action words. A language
model may put probability on replies that are not legal actions, so a row may sum to
less than 1; the evaluation renormalises over the legal actions (that is the policy the
model effectively plays once invalid replies are resampled) and reports the missing
mass separately (:func:`invalid_mass`).

All game theory (tree, exploitability, expected values) is delegated to OpenSpiel; this
module only translates our tables to :class:`open_spiel.python.policy.TabularPolicy`.

>>> round(exploitability_of(uniform_policy()), 4)
0.4583
>>> exploitability_of(nash_policy(1 / 6)) < 1e-9
True
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any, Iterable, Mapping, NamedTuple

import numpy as np
import pyspiel
from open_spiel.python import policy as policy_lib
from open_spiel.python.algorithms import expected_game_score, exploitability
from transformers import TrainerCallback

__all__ = [
    "CARDS",
    "ACTION_IDS",
    "InfoState",
    "INFO_STATES",
    "PolicyTable",
    "normalized",
    "uniform_policy",
    "nash_policy",
    "to_openspiel",
    "openspiel_info_state_strings",
    "exploitability_of",
    "invalid_mass",
    "own_reach",
    "AveragePolicy",
    "expected_chips",
    "evaluation_report",
    "plot_exploitability",
    "UNIFORM_EXPLOITABILITY",
    "NASH_VALUE_P0",
]

CARDS: tuple[str, ...] = ("J", "Q", "K")
"""Card names indexed by OpenSpiel card id: ``CARDS[0] == "J"``."""

# OpenSpiel's Kuhn poker has two action ids; their meaning depends on whether the player
# faces a bet: 0 = "Pass" (check or fold), 1 = "Bet" (bet or call).
ACTION_IDS: dict[str, int] = {"check": 0, "fold": 0, "bet": 1, "call": 1}
"""OpenSpiel action id of each of our action words: ``ACTION_IDS["call"] == 1``."""

UNIFORM_EXPLOITABILITY = 11 / 24
"""Exploitability (NashConv / 2) of the uniform random policy, ~0.4583."""

NASH_VALUE_P0 = -1 / 18
"""Game value of Kuhn poker for player 0 (the first to act) under any Nash equilibrium."""


class InfoState(NamedTuple):
    """An information state: the acting player, their own card and the public history.

    >>> s = InfoState(1, "Q", ("bet",))
    >>> s.legal_actions
    ('fold', 'call')
    >>> InfoState(0, "K", ()).legal_actions
    ('check', 'bet')
    """

    player: int
    card: str
    history: tuple[str, ...]

    @property
    def legal_actions(self) -> tuple[str, ...]:
        """Legal action words, ordered like OpenSpiel's action ids (pass first, bet second)."""
        facing_bet = bool(self.history) and self.history[-1] == "bet"
        return ("fold", "call") if facing_bet else ("check", "bet")


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

>>> len(INFO_STATES), INFO_STATES[0], INFO_STATES[-1]
(12, InfoState(player=0, card='J', history=()), InfoState(player=1, card='K', history=('bet',)))
"""

PolicyTable = dict[InfoState, dict[str, float]]
"""Per info state, probabilities over its legal action words (rows may sum to < 1).

>>> table = uniform_policy()
>>> table[InfoState(0, "J", ())]
{'check': 0.5, 'bet': 0.5}
"""


# --------------------------------------------------------------------------- helpers


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

    >>> normalized({InfoState(0, "J", ()): {"check": 0.375, "bet": 0.125}}, InfoState(0, "J", ()))
    {'check': 0.75, 'bet': 0.25}
    """
    row = _row(table, s)
    total = sum(row.values())
    if total <= 0.0:
        return {a: 1.0 / len(row) for a in row}
    return {a: p / total for a, p in row.items()}


def uniform_policy() -> PolicyTable:
    """The uniform random policy (each legal action with probability 1/2).

    >>> uniform_policy()[InfoState(1, "K", ("bet",))]
    {'fold': 0.5, 'call': 0.5}
    """
    return {s: {a: 0.5 for a in s.legal_actions} for s in INFO_STATES}


def nash_policy(alpha: float) -> PolicyTable:
    """The standard one-parameter family of Nash equilibria of Kuhn poker (Kuhn, 1950).

    Player 0 bets J with probability ``alpha``, always checks Q, bets K with probability
    ``3 * alpha``; after check-bet it folds J, calls Q with probability ``alpha + 1/3`` and
    always calls K. Player 1 (whose equilibrium strategy is unique) after a check bets J
    with probability 1/3, checks Q, bets K; facing a bet folds J, calls Q with probability
    1/3 and calls K. Valid for ``0 <= alpha <= 1/3``; the value for player 0 is -1/18.

    >>> nash_policy(1 / 6)[InfoState(0, "K", ())]
    {'check': 0.5, 'bet': 0.5}
    >>> nash_policy(0.5)
    Traceback (most recent call last):
    ...
    ValueError: alpha must be in [0, 1/3], got 0.5
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


# --------------------------------------------------------------------------- OpenSpiel bridge


@functools.lru_cache(maxsize=None)
def _game() -> pyspiel.Game:
    return pyspiel.load_game("kuhn_poker")


@functools.lru_cache(maxsize=None)
def openspiel_info_state_strings() -> dict[InfoState, str]:
    """Map each of our info states to OpenSpiel's ``information_state_string``.

    Found by walking OpenSpiel's game tree (never hard-coded), recording the acting player,
    their dealt card (from the chance outcomes) and the action words played so far; it also
    checks that the mapping is a bijection onto OpenSpiel's 12 info states.

    >>> openspiel_info_state_strings()[InfoState(1, "J", ("check",))]
    '0p'
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

    >>> pol = to_openspiel(nash_policy(0.0))
    >>> pol.policy_for_key(openspiel_info_state_strings()[InfoState(0, "K", ("check", "bet"))]).tolist()
    [0.0, 1.0]
    """
    pol = policy_lib.TabularPolicy(_game())
    for s, key in openspiel_info_state_strings().items():
        probs = np.zeros(_game().num_distinct_actions())
        for word, p in normalized(table, s).items():
            probs[ACTION_IDS[word]] = p
        pol.policy_for_key(key)[:] = probs
    return pol


# --------------------------------------------------------------------------- metrics


def exploitability_of(table: Mapping[InfoState, Mapping[str, float]]) -> float:
    """OpenSpiel's exploitability (NashConv / 2) of the renormalised table.

    0 exactly at a Nash equilibrium, ~0.4583 for the uniform policy.

    >>> exploitability_of(nash_policy(0.0)) < 1e-9
    True
    """
    return float(exploitability.exploitability(_game(), to_openspiel(table)))


def invalid_mass(table: Mapping[InfoState, Mapping[str, float]]) -> float:
    """Mean over the 12 info states of ``1 - sum(row)``: how much mass went to invalid replies.

    >>> invalid_mass({s: {a: 0.25 for a in s.legal_actions} for s in INFO_STATES})
    0.5
    """
    return float(np.mean([1.0 - sum(_row(table, s).values()) for s in INFO_STATES]))


def own_reach(table: Mapping[InfoState, Mapping[str, float]], info_state: InfoState) -> float:
    """Probability that the acting player's own (renormalised) actions lead to ``info_state``.

    Only the player's own earlier actions count (opponent and chance are excluded), which
    is what the average-strategy formula of fictitious play / CFR needs. It is 1 at a
    player's first decision; in Kuhn poker only player 0 at ``("check", "bet")`` has an
    earlier own action (the check).

    >>> own_reach(nash_policy(1 / 6), InfoState(0, "K", ("check", "bet")))
    0.5
    >>> own_reach(nash_policy(1 / 6), InfoState(1, "J", ("bet",)))
    1.0
    """
    s = InfoState(*info_state)
    reach = 1.0
    for i, word in enumerate(s.history):
        if i % 2 == s.player:  # players alternate, player 0 acts at even positions
            earlier = InfoState(s.player, s.card, s.history[:i])
            reach *= normalized(table, earlier)[word]
    return reach


class AveragePolicy:
    """Reach-weighted average of policy snapshots (the average strategy of FP / CFR).

    For each info state ``s``:
    ``avg(a|s) = sum_k w_k * reach_k(s) * pi_k(a|s) / sum_k w_k * reach_k(s)``
    with ``reach_k`` = :func:`own_reach` and ``pi_k`` the renormalised snapshot, so the
    average is the behaviour policy equivalent to playing snapshot ``k`` with probability
    proportional to ``w_k`` for a whole game. The average therefore has no invalid mass.
    Info states that no snapshot reaches get the uniform policy.

    >>> avg = AveragePolicy()
    >>> avg.add(nash_policy(0.0)); avg.add(nash_policy(1 / 3))
    >>> len(avg), avg.table()[InfoState(0, "K", ())]
    (2, {'check': 0.5, 'bet': 0.5})
    """

    def __init__(self) -> None:
        self._num: dict[InfoState, dict[str, float]] = {
            s: {a: 0.0 for a in s.legal_actions} for s in INFO_STATES
        }
        self._den: dict[InfoState, float] = {s: 0.0 for s in INFO_STATES}
        self._count = 0

    def add(self, table: Mapping[InfoState, Mapping[str, float]], weight: float = 1.0) -> None:
        """Accumulate one snapshot with a non-negative ``weight``."""
        if not (weight >= 0.0 and math.isfinite(weight)):
            raise ValueError(f"weight must be finite and >= 0, got {weight}")
        # Compute everything first so that an invalid table leaves the average untouched.
        rows = {s: normalized(table, s) for s in INFO_STATES}
        reaches = {s: own_reach(table, s) for s in INFO_STATES}
        for s in INFO_STATES:
            w = weight * reaches[s]
            self._den[s] += w
            for a, p in rows[s].items():
                self._num[s][a] += w * p
        self._count += 1

    def table(self) -> PolicyTable:
        """The current average policy as a :data:`PolicyTable` (rows sum to 1)."""
        out: PolicyTable = {}
        for s in INFO_STATES:
            den = self._den[s]
            if den > 0.0:
                out[s] = {a: v / den for a, v in self._num[s].items()}
            else:
                out[s] = {a: 1.0 / len(s.legal_actions) for a in s.legal_actions}
        return out

    def __len__(self) -> int:
        """Number of snapshots added."""
        return self._count

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state (round-trips through :meth:`load_state_dict`)."""
        return {
            "count": self._count,
            "states": [
                {
                    "player": s.player,
                    "card": s.card,
                    "history": list(s.history),
                    "numerators": dict(self._num[s]),
                    "denominator": self._den[s],
                }
                for s in INFO_STATES
            ],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict` output (e.g. after ``json.loads``)."""
        num = {s: {a: 0.0 for a in s.legal_actions} for s in INFO_STATES}
        den = {s: 0.0 for s in INFO_STATES}
        for entry in state["states"]:
            s = InfoState(int(entry["player"]), str(entry["card"]), tuple(entry["history"]))
            if s not in den:
                raise ValueError(f"unknown info state {s}")
            for a, v in entry["numerators"].items():
                if a not in num[s]:
                    raise ValueError(f"{s}: illegal action {a!r}")
                num[s][a] = float(v)
            den[s] = float(entry["denominator"])
        self._num, self._den, self._count = num, den, int(state["count"])


def expected_chips(
    table: Mapping[InfoState, Mapping[str, float]],
    opponent: Mapping[InfoState, Mapping[str, float]],
    seat: int,
) -> float:
    """Exact expected chips won by ``seat`` playing ``table`` against ``opponent``.

    Both tables are renormalised; only the rows of the respective seat are used. Computed
    by OpenSpiel's ``expected_game_score.policy_value`` (full enumeration, no sampling).

    >>> round(expected_chips(nash_policy(1 / 6), nash_policy(1 / 6), seat=0), 6) == round(-1 / 18, 6)
    True
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

    >>> r = evaluation_report(nash_policy(1 / 6))
    >>> sorted(r)
    ['chips_vs_nash_p0', 'chips_vs_nash_p1', 'chips_vs_random_p0', 'chips_vs_random_p1', 'exploitability', 'invalid_mass']
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


def plot_exploitability(points: Iterable[Mapping[str, Any]], path: str) -> None:
    """Save a PNG of exploitability (current and average policy) against episodes.

    ``points`` items have keys ``"episodes"``, ``"exploitability"`` and
    ``"avg_exploitability"`` (``None`` allowed, e.g. before any snapshot was averaged).
    Dashed reference lines mark the uniform policy (~0.458) and Nash (0).

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "exploitability.png")
    >>> plot_exploitability([{"episodes": 0, "exploitability": 0.46, "avg_exploitability": None},
    ...                      {"episodes": 64, "exploitability": 0.30, "avg_exploitability": 0.35}], path)
    >>> os.path.getsize(path) > 0
    True
    """
    # Figure + Agg canvas directly, so we never touch pyplot's global backend/state
    # (safe in headless training jobs and alongside other plotting code).
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    points = sorted(points, key=lambda p: p["episodes"])
    fig = Figure(figsize=(6, 4), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    xs = [p["episodes"] for p in points]
    ax.plot(xs, [p["exploitability"] for p in points], marker="o", ms=3, label="current policy")
    avg = [(p["episodes"], p.get("avg_exploitability")) for p in points]
    avg = [(x, y) for x, y in avg if y is not None]
    if avg:
        ax.plot(*zip(*avg), marker="s", ms=3, label="average policy")
    ax.axhline(UNIFORM_EXPLOITABILITY, ls="--", color="gray", lw=1, label="uniform random (0.458)")
    ax.axhline(0.0, ls="--", color="black", lw=1, label="Nash (0)")
    # Keep both reference lines visibly inside the axes, not on its frame.
    top = max([UNIFORM_EXPLOITABILITY] + [p["exploitability"] for p in points] + [y for _, y in avg])
    ax.set_ylim(-0.03, top * 1.08 + 0.02)
    ax.set_xlabel("episodes")
    ax.set_ylabel("exploitability (NashConv / 2)")
    ax.set_title("Kuhn poker exploitability")
    ax.legend(loc="center right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png")


# -- reading a language model's policy -------------------------------------------------------


def info_state_context(template, info_state: InfoState) -> list[int]:
    """The exact tokens a seat has seen when it reaches ``info_state`` on the clean path (no re-prompts).

    ``template`` is a :class:`multiagent_rl.agent.ChatTemplate`; the context is built with the same
    pieces the chat harness uses during play (prompt, own earlier action, observation).
    """
    from ..envs.kuhn_poker import decision_prompt

    player, card, history = info_state
    if player == 0 and history:  # player 0's second decision: after its own check and player 1's bet
        first = template.prompt_ids([{"role": "user", "content": decision_prompt(0, card, ())}])
        action = template.encode(history[0])
        return first + action + template.user_turn_ids(decision_prompt(0, card, history), reply_ended_turn=False)
    return template.prompt_ids([{"role": "user", "content": decision_prompt(player, card, history)}])


def _single_token_actions(tokenizer, history: tuple[str, ...]) -> dict[int, str]:
    """Every vocabulary token that, as a one-token reply, parses to a legal action."""
    from ..envs.kuhn_poker import parse_action

    out = {}
    for token_id in range(len(tokenizer)):
        action = parse_action(tokenizer.decode([token_id], skip_special_tokens=True), history)
        if action is not None:
            out[token_id] = action
    return out


def read_policy(model, tokenizer, reply_tokens: int = 1, legal_choices: bool = False) -> PolicyTable:
    """The model's action probabilities at all 12 information states.

    ``legal_choices=True`` (the env's legal-action harness) reads exactly what the harness samples:
    each legal word's token sequence (with the end-of-turn token) scored by the softmax over the
    allowed ids at each step, so every row sums to 1. Otherwise (free text), with one-token replies
    this is exact: the mass of every token that parses to each legal action, from one batched
    forward pass; with longer replies it is the probability of replying with exactly the action
    word's tokens, a lower bound of the play-time probability. The mass not on legal actions
    (``invalid_mass``) is what the model would spend on invalid replies.
    """
    import torch

    from ..agent import ChatTemplate

    template = ChatTemplate(tokenizer)
    contexts = [info_state_context(template, s) for s in INFO_STATES]
    device = next(model.parameters()).device
    table: PolicyTable = {}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            if legal_choices:
                for s, c in zip(INFO_STATES, contexts):
                    table[s] = _constrained_row(model, template, c, s.legal_actions)
            elif reply_tokens == 1:
                width = max(map(len, contexts))
                ids = torch.full((len(contexts), width), tokenizer.pad_token_id, dtype=torch.long)
                mask = torch.zeros_like(ids)
                for i, c in enumerate(contexts):
                    ids[i, width - len(c) :], mask[i, width - len(c) :] = torch.tensor(c), 1
                logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits[:, -1].float()
                probs = torch.softmax(logits, -1).cpu()
                maps = {h: _single_token_actions(tokenizer, h) for h in {s.history for s in INFO_STATES}}
                for i, s in enumerate(INFO_STATES):
                    row = {a: 0.0 for a in s.legal_actions}
                    for token_id, action in maps[s.history].items():
                        row[action] += probs[i, token_id].item()
                    table[s] = row
            else:
                for s, c in zip(INFO_STATES, contexts):
                    row = {}
                    for action in s.legal_actions:
                        a = template.encode(action)
                        seq = torch.tensor([c + a], device=device)
                        logp = torch.log_softmax(model(input_ids=seq).logits[0, len(c) - 1 : -1].float(), -1)
                        row[action] = logp.gather(-1, torch.tensor(a, device=device)[:, None]).sum().exp().item()
                    table[s] = row
    finally:
        model.train(was_training)
    return table


def _constrained_row(model, template, context: list[int], actions: tuple[str, ...]) -> dict[str, float]:
    """P(each action) under the legal-action harness: restricted softmax, token by token."""
    from ..agent import choice_steps
    from ..scoring import token_logprobs

    options = template.choice_ids(actions)
    row = {}
    for action, ids in options.items():
        (scores,) = token_logprobs(model, [context + ids], allowed=[[None] * len(context) + choice_steps(options, ids)])
        row[action] = math.exp(sum(scores[len(context) :]))
    return row


# -- evaluation during training ---------------------------------------------------------------


class KuhnEvaluation(TrainerCallback):
    """Exact evaluation at fixed steps: current and average policy exploitability, invalid replies.

    Every ``every`` steps (and at the last) the policy is read at all 12 information states; from
    ``start_step`` on each reading joins the reach-weighted average policy (linear weights, as in
    CFR+). The numbers go into the trainer's log as ``eval/kuhn/...`` (printed on the console line)
    and into :attr:`points`. Invalid replies are counted over the policy's seats in every Kuhn poker
    environment of the run, whatever its label. With ``legal_choices=True`` (the env's legal-action
    harness) the policy is read as the harness plays it (``read_policy(..., legal_choices=True)``),
    and that is what is averaged; ``invalid_mass`` then still reports the mass the unconstrained
    model puts on other tokens, as a diagnostic only. Its state (the average, the curve) travels in
    checkpoints, so a resumed run continues the same curve.
    """

    def __init__(self, every: int, start_step: int = 0, reply_tokens: int = 1, legal_choices: bool = False):
        self.every, self.start_step, self.reply_tokens = every, start_step, reply_tokens
        self.legal_choices = legal_choices
        self.average = AveragePolicy()
        self.points: list[dict] = []
        self.trainer = None  # set after the trainer is built: evaluation.trainer = trainer
        self.started = time.time()

    def state_dict(self) -> dict[str, Any]:
        return {"average": self.average.state_dict(), "points": self.points,
                "seconds": time.time() - self.started}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.average.load_state_dict(state["average"])
        self.points = list(state["points"])
        self.started = time.time() - float(state["seconds"])

    def _policy_traces(self, trainer) -> list:
        from ..envs.kuhn_poker import KuhnPokerEnv

        labels = {label for label, env in zip(trainer.env_labels, trainer.envs) if isinstance(env, KuhnPokerEnv)}
        return [t for ep in trainer.last_episodes if ep.env in labels for t in ep.traces if t.model == "policy"]

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        if step % self.every and step != state.max_steps:
            return
        trainer = self.trainer
        model = trainer.accelerator.unwrap_model(trainer.model)
        table = read_policy(model, trainer.tokenizer, self.reply_tokens, legal_choices=self.legal_choices)
        raw = read_policy(model, trainer.tokenizer, self.reply_tokens) if self.legal_choices else table
        if step >= self.start_step:
            # Linear averaging (as in CFR+): later, better policies weigh more than early ones.
            self.average.add(table, weight=len(self.average) + 1)
        rollouts = self._policy_traces(trainer)
        decisions = sum(len(t.messages) // 2 for t in rollouts)
        point = {
            "step": step,
            "episodes": trainer.episodes_played,
            "seconds": round(time.time() - self.started, 1),
            "exploitability": exploitability_of(table),
            "avg_exploitability": exploitability_of(self.average.table()) if len(self.average) else None,
            "invalid_mass": invalid_mass(raw),
            "invalid_reply_rate": sum(t.metrics.get("invalid_replies", 0) for t in rollouts) / max(1, decisions),
            "decisions": decisions,
        }
        self.points.append(point)
        for key in ("exploitability", "avg_exploitability", "invalid_reply_rate"):
            if point[key] is not None:
                trainer.record_metric(f"eval/kuhn/{key}", point[key])
