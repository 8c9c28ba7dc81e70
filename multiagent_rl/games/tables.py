"""What the poker evaluations share: a model's probabilities of legal action words, read as the legal-action harness
plays them, and tabular policies handed to OpenSpiel.

A game plugs in with its information states, the tokens a seat sees at each one, its legal words, and the map from
OpenSpiel's information-state strings to its own states (``multiagent_rl.envs.kuhn_poker.exploitability``, ``multiagent_rl.envs.leduc_poker.evaluation``).
"""

from __future__ import annotations

import math
from typing import Hashable, Mapping, Sequence

import numpy as np
import torch
from open_spiel.python import policy as policy_lib

from ..agents.chat_template import ChatTemplate, choice_steps
from ..backends.scoring import eval_mode, token_logprobs


def choice_probabilities(model, template: ChatTemplate,
                         items: Sequence[tuple[Hashable, list[int], Sequence[str]]],
                         batch_size: int = 256) -> dict[Hashable, dict[str, float]]:
    """For each ``(state, context token ids, legal words)``: the probability of each word as the legal-action
    harness samples it (its tokens scored by the softmax over the allowed ids at each step), batched."""
    reads = []
    for state, context, words in items:
        options = template.choice_ids(tuple(words))
        reads += [(state, word, context, ids, choice_steps(options, ids)) for word, ids in options.items()]
    out: dict[Hashable, dict[str, float]] = {}
    with eval_mode(model), torch.no_grad():
        for start in range(0, len(reads), batch_size):
            chunk = reads[start:start + batch_size]
            scores = token_logprobs(model, [c + ids for _, _, c, ids, _ in chunk], batch_size=len(chunk),
                                    allowed=[[None] * len(c) + steps for _, _, c, _, steps in chunk])
            for (state, word, c, _, _), score in zip(chunk, scores):
                out.setdefault(state, {})[word] = math.exp(sum(score[len(c):]))
    return out


def tabular_policy(game, keys: Mapping[str, Hashable], table: Mapping[Hashable, Mapping[str, float]],
                   action_ids: Mapping[str, int]) -> policy_lib.TabularPolicy:
    """An OpenSpiel ``TabularPolicy`` for ``game`` from a table over the game's own states (``keys`` maps each of
    OpenSpiel's information-state strings to one), every row renormalised over its words."""
    pol = policy_lib.TabularPolicy(game)
    for key, state in keys.items():
        row = table[state]
        total = sum(row.values())
        probs = np.zeros(game.num_distinct_actions())
        for word, p in row.items():
            probs[action_ids[word]] = p / total if total > 0 else 1 / len(row)
        pol.policy_for_key(key)[:] = probs
    return pol
