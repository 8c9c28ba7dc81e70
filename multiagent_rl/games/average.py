"""The reach-weighted average of policy snapshots, for any game with perfect recall (the average strategy of
fictitious play and CFR, the policy self-play's convergence guarantees are about).

For each information state s: ``avg(a|s) = Σ_k w_k ρ_k(s) π_k(a|s) / Σ_k w_k ρ_k(s)``, with ``π_k`` snapshot k's
renormalised row and ``ρ_k(s)`` the acting player's own probability of the actions that lead to s under it. The
average is the behaviour policy equivalent to playing snapshot k with probability proportional to ``w_k`` for a
whole game. States no snapshot reaches get the uniform policy. A game supplies its states, legal actions, own-reach
and row normalisation, and how a state is written in a checkpoint ([`multiagent_rl.envs.kuhn_poker.rules.AveragePolicy`][],
[`multiagent_rl.envs.leduc_poker.rules.AveragePolicy`][]).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Hashable, Mapping, Sequence

Table = Mapping[Hashable, Mapping[str, float]]


class ReachWeightedAverage:
    def __init__(self, states: Sequence[Hashable], legal: Callable[[Any], Sequence[str]],
                 own_reach: Callable[[Table, Any], float], normalized: Callable[[Table, Any], dict[str, float]],
                 encode: Callable[[Any], dict[str, Any]], decode: Callable[[Mapping[str, Any]], Hashable]):
        self._states, self._legal, self._own_reach, self._normalized = tuple(states), legal, own_reach, normalized
        self._encode, self._decode = encode, decode
        self._num: dict[Hashable, dict[str, float]] = {s: {a: 0.0 for a in legal(s)} for s in self._states}
        self._den: dict[Hashable, float] = {s: 0.0 for s in self._states}
        self._count = 0

    def add(self, table: Table, weight: float = 1.0) -> None:
        """Accumulate one snapshot with a non-negative ``weight``."""
        if not (weight >= 0.0 and math.isfinite(weight)):
            raise ValueError(f"weight must be finite and >= 0, got {weight}")
        # Compute everything first so that an invalid table leaves the average untouched.
        rows = {s: self._normalized(table, s) for s in self._states}
        reaches = {s: self._own_reach(table, s) for s in self._states}
        for s in self._states:
            w = weight * reaches[s]
            self._den[s] += w
            for a, p in rows[s].items():
                self._num[s][a] += w * p
        self._count += 1

    def table(self) -> dict[Hashable, dict[str, float]]:
        """The current average policy (rows sum to 1)."""
        out = {}
        for s in self._states:
            den = self._den[s]
            legal = self._legal(s)
            out[s] = ({a: v / den for a, v in self._num[s].items()} if den > 0.0
                      else {a: 1.0 / len(legal) for a in legal})
        return out

    def __len__(self) -> int:
        """Number of snapshots added."""
        return self._count

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state (round-trips through
        [`load_state_dict`][multiagent_rl.games.average.ReachWeightedAverage.load_state_dict])."""
        return {"count": self._count,
                "states": [{**self._encode(s), "numerators": dict(self._num[s]), "denominator": self._den[s]}
                           for s in self._states]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from [`state_dict`][multiagent_rl.games.average.ReachWeightedAverage.state_dict] output (e.g. after
        ``json.loads``)."""
        num = {s: {a: 0.0 for a in self._legal(s)} for s in self._states}
        den = {s: 0.0 for s in self._states}
        for entry in state["states"]:
            s = self._decode(entry)
            if s not in den:
                raise ValueError(f"unknown info state {s}")
            for a, v in entry["numerators"].items():
                if a not in num[s]:
                    raise ValueError(f"{s}: illegal action {a!r}")
                num[s][a] = float(v)
            den[s] = float(entry["denominator"])
        self._num, self._den, self._count = num, den, int(state["count"])
