"""Reading a language model's Kuhn poker policy, evaluating it during training, plotting the curve.

[`read_policy`][multiagent_rl.envs.kuhn_poker.evaluation.read_policy] reads the model's action probabilities at all 12 information
states, at exactly the tokens a seat sees during play; [`KuhnEvaluation`][multiagent_rl.envs.kuhn_poker.evaluation.KuhnEvaluation]
does so every few training steps and scores the current and the average policy with OpenSpiel
([`multiagent_rl.envs.kuhn_poker.exploitability`][]).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import torch
from transformers import TrainerCallback

from ...agents.chat_template import ChatTemplate
from ...backends.scoring import eval_mode, model_device
from ...games.evaluation import GameEvaluation
from ...games.tables import choice_probabilities
from . import KuhnPokerEnv, decision_prompt, parse_action
from .exploitability import exploitability_of
from .rules import INFO_STATES, UNIFORM_EXPLOITABILITY, AveragePolicy, InfoState, PolicyTable, invalid_mass


def plot_exploitability(points: Iterable[Mapping[str, Any]], path: str) -> None:
    """Save a PNG of exploitability (current and average policy) against episodes.

    ``points`` items have keys ``"episodes"``, ``"exploitability"`` and
    ``"avg_exploitability"`` (``None`` allowed, e.g. before any snapshot was averaged).
    Dashed reference lines mark the uniform policy (~0.458) and Nash (0).

    ```pycon
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "exploitability.png")
    >>> plot_exploitability([{"episodes": 0, "exploitability": 0.46, "avg_exploitability": None},
    ...                      {"episodes": 64, "exploitability": 0.30, "avg_exploitability": 0.35}], path)
    >>> os.path.getsize(path) > 0
    True

    ```
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


def info_state_context(template, info_state: InfoState) -> list[int]:
    """The exact tokens a seat has seen when it reaches ``info_state`` on the clean path (no re-prompts).

    ``template`` is a [`ChatTemplate`][multiagent_rl.agents.chat_template.ChatTemplate]; the context is built with the
    same pieces the chat harness uses during play (prompt, own earlier action, observation).
    """
    player, card, history = info_state
    if player == 0 and history:  # player 0's second decision: after its own check and player 1's bet
        first = template.prompt_ids([{"role": "user", "content": decision_prompt(0, card, ())}])
        action = template.encode(history[0])
        return first + action + template.user_turn_ids(decision_prompt(0, card, history), reply_ended_turn=False)
    return template.prompt_ids([{"role": "user", "content": decision_prompt(player, card, history)}])


def _single_token_actions(tokenizer, history: tuple[str, ...]) -> dict[int, str]:
    """Every vocabulary token that, as a one-token reply, parses to a legal action."""
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
    template = ChatTemplate(tokenizer)
    contexts = [info_state_context(template, s) for s in INFO_STATES]
    device = model_device(model)
    table: PolicyTable = {}
    with eval_mode(model), torch.no_grad():
        if legal_choices:  # every legal word at every state, scored in one batch
            table.update(choice_probabilities(model, template, [(s, c, s.legal_actions)
                                                                for s, c in zip(INFO_STATES, contexts)]))
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
    return table


def imitation_report(table: PolicyTable, teacher: PolicyTable, blind_spread: float = 0.1) -> dict[str, Any]:
    """How closely ``table`` plays ``teacher`` (a warm-up's scripted strategy), per decision point.

    ``max_gap`` is the largest |P(bet or call) − teacher's| over the 12 information states (at ``worst``);
    ``card_blind`` lists the decision points (player, history) where the teacher's probability differs across
    the three cards by at least 0.5 but the table's by less than ``blind_spread``: there the policy has not learned
    to read its card. Self-play from such a start can stall (docs/kuhn_poker_results.md).
    """
    def bold(t, s):
        return t[s][s.legal_actions[1]]

    gaps = {s: abs(bold(table, s) - bold(teacher, s)) for s in INFO_STATES}
    worst = max(gaps, key=gaps.get)
    blind = []
    for player, history in dict.fromkeys((s.player, s.history) for s in INFO_STATES):
        states = [s for s in INFO_STATES if (s.player, s.history) == (player, history)]
        ours, theirs = [bold(table, s) for s in states], [bold(teacher, s) for s in states]
        if max(theirs) - min(theirs) >= 0.5 and max(ours) - min(ours) < blind_spread:
            blind.append({"player": player, "history": list(history), "probabilities": [round(p, 3) for p in ours],
                          "teacher": [round(p, 3) for p in theirs]})
    return {"max_gap": round(gaps[worst], 4), "worst": f"player {worst.player} with {worst.card} after "
            f"{' '.join(worst.history) or 'the deal'}", "card_blind": blind}


# -- evaluation during training ---------------------------------------------------------------


class KuhnEvaluation(GameEvaluation):
    """Exact evaluation at fixed steps ([`GameEvaluation`][multiagent_rl.games.evaluation.GameEvaluation]): current and
    average policy exploitability at Kuhn poker's 12 information states, and invalid replies.

    Invalid replies are counted over the policy's seats in every Kuhn poker environment of the run, whatever its
    label. With ``legal_choices=True`` (the env's legal-action harness) the policy is read as the harness plays it
    (``read_policy(..., legal_choices=True)``), and that is what is averaged; ``invalid_mass`` then still reports
    the mass the unconstrained model puts on other tokens, as a diagnostic only.
    """

    name = "kuhn"
    logged = ("exploitability", "avg_exploitability", "invalid_reply_rate")

    def __init__(self, every: int, start_step: int = 0, reply_tokens: int = 1, legal_choices: bool = False,
                 at_start: bool = False):
        super().__init__(every, start_step, at_start)
        self.reply_tokens, self.legal_choices = reply_tokens, legal_choices

    def new_average(self) -> AveragePolicy:
        return AveragePolicy()

    def read(self, model, tokenizer) -> PolicyTable:
        return read_policy(model, tokenizer, self.reply_tokens, legal_choices=self.legal_choices)

    def exploitability(self, table) -> float:
        return exploitability_of(table)

    def extra(self, trainer, model, table) -> dict[str, Any]:
        raw = read_policy(model, trainer.tokenizer, self.reply_tokens) if self.legal_choices else table
        rollout = trainer.rollout
        labels = {slot.label for slot in rollout.slots if isinstance(slot.env, KuhnPokerEnv)}
        traces = [t for ep in rollout.last_episodes if ep.env in labels for t in ep.traces if t.model == "policy"]
        decisions = sum(len(t.messages) // 2 for t in traces)
        return {"invalid_mass": invalid_mass(raw),
                "invalid_reply_rate": (sum(t.metrics.get("invalid_replies", 0) for t in traces) / decisions
                                       if decisions else None),  # nothing played yet (a step-0 point)
                "decisions": decisions}


class WarmupCheck(TrainerCallback):
    """At the warm-up's last step, how closely the policy plays the warm-up teacher
    ([`imitation_report`][multiagent_rl.envs.kuhn_poker.evaluation.imitation_report]): one console line, and a warning naming
    every decision point where the policy has not learned to read its card (self-play from such a start can stall:
    docs/kuhn_poker_results.md). The Kuhn recipe puts the report into ``summary.json`` as ``warmup_check``."""

    def __init__(self, step: int, teacher: dict, evaluation: KuhnEvaluation):
        self.step, self.teacher, self.evaluation = step, teacher, evaluation
        self.report: dict | None = None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step != self.step:
            return
        trainer = self.evaluation.trainer
        table = self.evaluation.read(trainer.accelerator.unwrap_model(trainer.model), trainer.tokenizer)
        self.report = imitation_report(table, self.teacher)
        if not trainer.accelerator.is_main_process:
            return
        print(f"warm-up check at step {self.step}: largest gap to the teacher {self.report['max_gap']:.3f} "
              f"({self.report['worst']})", flush=True)
        for blind in self.report["card_blind"]:
            where = " ".join(blind["history"]) or "the deal"
            print(f"WARNING: after the warm-up, player {blind['player']} plays the same after {where} with J, Q and K "
                  f"(P(bet or call) {blind['probabilities']}; teacher {blind['teacher']}): it has not learned to "
                  "read its card there, and self-play from such a start can stall (docs/kuhn_poker_results.md). "
                  "Try another seed or a longer warm-up.", flush=True)



def evaluate(model, tokenizer, legal_choices: bool = True, reply_tokens: int = 1) -> dict[str, float]:
    """The exact report of a saved model's Kuhn policy (``multiagent-rl eval kuhn_poker --model PATH``): its action
    probabilities read at all 12 information states (through the legal-action harness unless ``legal_choices`` is
    false), scored by OpenSpiel ([`evaluation_report`][multiagent_rl.envs.kuhn_poker.exploitability.evaluation_report])."""
    from .exploitability import evaluation_report

    return evaluation_report(read_policy(model, tokenizer, reply_tokens=reply_tokens, legal_choices=legal_choices))
