"""Exact Kuhn poker evaluation, checked against OpenSpiel and known game-theory values."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import doctest
import json
import math

import numpy as np
import pyspiel
import pytest
from open_spiel.python import policy as policy_lib
from open_spiel.python.algorithms import expected_game_score, exploitability

from multiagent_rl.envs.kuhn_poker import exploitability as kuhn
from multiagent_rl.envs.kuhn_poker.exploitability import evaluation_report, expected_chips, exploitability_of, to_openspiel
from multiagent_rl.envs.kuhn_poker.evaluation import plot_exploitability
from multiagent_rl.envs.kuhn_poker import rules as game
from multiagent_rl.envs.kuhn_poker.rules import (
    CARDS,
    INFO_STATES,
    AveragePolicy,
    InfoState,
    invalid_mass,
    nash_policy,
    own_reach,
    uniform_policy,
)

GAME = pyspiel.load_game("kuhn_poker")


def pure(bets: dict) -> game.PolicyTable:
    """Pure strategy: ``bets[s]`` True plays the aggressive action (bet/call) at ``s``."""
    return {
        s: dict(zip(s.legal_actions, (0.0, 1.0) if bets.get(s, False) else (1.0, 0.0)))
        for s in INFO_STATES
    }


def random_table(rng) -> game.PolicyTable:
    out = {}
    for s in INFO_STATES:
        p = rng.uniform()
        out[s] = dict(zip(s.legal_actions, (1 - p, p)))
    return out


def test_info_states():
    assert CARDS == ("J", "Q", "K")
    assert len(INFO_STATES) == 12 and len(set(INFO_STATES)) == 12
    assert INFO_STATES[0] == InfoState(0, "J", ())
    assert InfoState(0, "Q", ("check", "bet")).legal_actions == ("fold", "call")
    assert InfoState(1, "Q", ("check",)).legal_actions == ("check", "bet")
    # Mapping to OpenSpiel info-state strings covers exactly OpenSpiel's 12 info states.
    strings = kuhn.openspiel_info_state_strings()
    assert set(strings.values()) == set(policy_lib.TabularPolicy(GAME).state_lookup)


def test_uniform_exploitability():
    assert exploitability_of(uniform_policy()) == pytest.approx(0.4583, abs=1e-3)
    # Same as OpenSpiel's own uniform policy.
    ref = exploitability.exploitability(GAME, policy_lib.UniformRandomPolicy(GAME))
    assert exploitability_of(uniform_policy()) == pytest.approx(ref, abs=1e-12)


@pytest.mark.parametrize("alpha", [0.0, 1 / 6, 1 / 3, 0.1])
def test_nash_family_is_unexploitable(alpha):
    assert exploitability_of(nash_policy(alpha)) < 1e-9


@pytest.mark.parametrize("alpha", [-0.01, 0.34, 1.0])
def test_nash_alpha_out_of_range(alpha):
    with pytest.raises(ValueError):
        nash_policy(alpha)


def test_to_openspiel_round_trip():
    table = random_table(np.random.default_rng(0))
    pol = to_openspiel(table)
    strings = kuhn.openspiel_info_state_strings()
    for s in INFO_STATES:
        probs = pol.policy_for_key(strings[s])
        for word, p in table[s].items():
            assert probs[kuhn.ACTION_IDS[word]] == pytest.approx(p)


def test_invalid_mass_is_renormalised_and_reported():
    rng = np.random.default_rng(1)
    table = random_table(rng)
    half = {s: {a: 0.5 * p for a, p in row.items()} for s, row in table.items()}
    assert exploitability_of(half) == pytest.approx(exploitability_of(table), abs=1e-12)
    assert invalid_mass(half) == pytest.approx(0.5)
    assert invalid_mass(table) == pytest.approx(0.0)
    # Missing words count as 0; a row with no legal mass plays uniformly.
    partial = dict(uniform_policy())
    partial[InfoState(0, "J", ())] = {"check": 0.2}
    partial[InfoState(1, "K", ("bet",))] = {}
    assert invalid_mass(partial) == pytest.approx((0.8 + 1.0) / 12)
    assert exploitability_of(partial) == pytest.approx(
        exploitability_of({**partial, InfoState(0, "J", ()): {"check": 1.0, "bet": 0.0}})
    )
    report = evaluation_report(half)
    assert report["invalid_mass"] == pytest.approx(0.5)


def test_bad_tables_rejected():
    table = uniform_policy()
    with pytest.raises(ValueError):
        exploitability_of({**table, InfoState(0, "J", ()): {"call": 1.0}})
    with pytest.raises(ValueError):
        exploitability_of({**table, InfoState(0, "J", ()): {"check": 0.9, "bet": 0.9}})
    with pytest.raises(ValueError):
        exploitability_of({s: r for s, r in table.items() if s != INFO_STATES[3]})


def test_own_reach():
    t = nash_policy(1 / 6)
    assert own_reach(t, InfoState(0, "K", ())) == 1.0
    assert own_reach(t, InfoState(0, "K", ("check", "bet"))) == pytest.approx(0.5)
    assert own_reach(t, InfoState(0, "Q", ("check", "bet"))) == pytest.approx(1.0)
    assert own_reach(t, InfoState(0, "J", ("check", "bet"))) == pytest.approx(5 / 6)
    assert own_reach(t, InfoState(1, "J", ("check",))) == 1.0
    # Renormalised before multiplying.
    half = {s: {a: 0.5 * p for a, p in row.items()} for s, row in t.items()}
    assert own_reach(half, InfoState(0, "K", ("check", "bet"))) == pytest.approx(0.5)


def test_average_of_two_pure_strategies():
    # A: player 0 always bets; B: player 0 always checks then calls. Player 1 differs too.
    a = pure({s: True for s in INFO_STATES if s.player == 0 and s.history == ()})
    b = pure({s: True for s in INFO_STATES if s.history == ("check", "bet")} | {
        InfoState(1, "K", ("check",)): True, InfoState(1, "K", ("bet",)): True})
    avg = AveragePolicy()
    avg.add(a, weight=1.0)
    avg.add(b, weight=3.0)
    assert len(avg) == 2
    got = avg.table()

    # Hand computation. Player 0 first decision: reach 1 in both -> bet = (1*1 + 3*0)/4.
    expected = {}
    for c in CARDS:
        expected[InfoState(0, c, ())] = {"check": 0.75, "bet": 0.25}
        # After check-bet only B reaches (A never checks), so the average is B's row: call.
        expected[InfoState(0, c, ("check", "bet"))] = {"fold": 0.0, "call": 1.0}
        # Player 1: reach 1 in both -> weights 1/4, 3/4.
        k = c == "K"
        expected[InfoState(1, c, ("check",))] = {"check": 1 - 0.75 * k, "bet": 0.75 * k}
        expected[InfoState(1, c, ("bet",))] = {"fold": 1 - 0.75 * k, "call": 0.75 * k}
    for s in INFO_STATES:
        for w in s.legal_actions:
            assert got[s][w] == pytest.approx(expected[s][w]), (s, w)

    # The average is the behaviour policy of the mixture "play A w.p. 1/4, B w.p. 3/4":
    # its exploitability equals OpenSpiel's on that mixture, and so does its value.
    mix = policy_lib.TabularPolicy(GAME)
    pa, pb = to_openspiel(a), to_openspiel(b)
    strings = kuhn.openspiel_info_state_strings()
    for s in INFO_STATES:
        key = strings[s]
        ra, rb = 0.25 * own_reach(a, s), 0.75 * own_reach(b, s)
        if ra + rb > 0:
            mix.policy_for_key(key)[:] = (
                ra * pa.policy_for_key(key) + rb * pb.policy_for_key(key)) / (ra + rb)
    assert exploitability_of(got) == pytest.approx(
        exploitability.exploitability(GAME, mix), abs=1e-12)
    # Kuhn's theorem check: value of the averaged behaviour policy vs a fixed opponent equals
    # the mixture of the two pure strategies' values.
    opp = nash_policy(1 / 6)
    mixture_value = 0.25 * expected_chips(a, opp, 0) + 0.75 * expected_chips(b, opp, 0)
    assert expected_chips(got, opp, 0) == pytest.approx(mixture_value, abs=1e-12)


def test_average_policy_state_dict_and_unreached():
    avg = AveragePolicy()
    a = pure({s: True for s in INFO_STATES if s.player == 0 and s.history == ()})
    avg.add(a)
    # Player 0 never checks, so ("check","bet") states are unreached -> uniform.
    assert avg.table()[InfoState(0, "Q", ("check", "bet"))] == {"fold": 0.5, "call": 0.5}
    avg.add(nash_policy(1 / 6), weight=2.0)
    restored = AveragePolicy()
    restored.load_state_dict(json.loads(json.dumps(avg.state_dict())))
    assert len(restored) == 2 and restored.table() == avg.table()
    with pytest.raises(ValueError):
        avg.add(a, weight=-1.0)


def test_average_of_nash_is_nash():
    avg = AveragePolicy()
    for alpha in (0.0, 0.1, 1 / 3):
        avg.add(nash_policy(alpha))
    assert exploitability_of(avg.table()) < 1e-9


def test_nash_value_for_player_0():
    nash = nash_policy(1 / 6)
    assert expected_chips(nash, nash, 0) == pytest.approx(-1 / 18, abs=1e-12)
    assert expected_chips(nash, nash, 1) == pytest.approx(1 / 18, abs=1e-12)
    for alpha in (0.0, 1 / 3):
        assert expected_chips(nash_policy(alpha), nash, 0) == pytest.approx(-1 / 18, abs=1e-12)


def _enumerate_value(p0_table, p1_table, seat):
    """Independent exact enumeration over deals and action sequences (our own tree)."""
    total = 0.0
    for i, c0 in enumerate(CARDS):
        for j, c1 in enumerate(CARDS):
            if i == j:
                continue
            cards, tables = (c0, c1), (p0_table, p1_table)

            def go(hist, prob):
                # Terminal payoffs for player 0 (ante 1, bet 1).
                showdown = 1 if CARDS.index(cards[0]) > CARDS.index(cards[1]) else -1
                terminal = {
                    ("check", "check"): showdown, ("bet", "fold"): 1, ("bet", "call"): 2 * showdown,
                    ("check", "bet", "fold"): -1, ("check", "bet", "call"): 2 * showdown,
                }
                if hist in terminal:
                    v = terminal[hist]
                    return prob * (v if seat == 0 else -v)
                player = len(hist) % 2
                s = InfoState(player, cards[player], hist)
                row = game.normalized(tables[player], s)
                return sum(go(hist + (a,), prob * p) for a, p in row.items())

            total += go((), 1 / 6)
    return total


def test_expected_chips_matches_openspiel_and_enumeration():
    rng = np.random.default_rng(2)
    for _ in range(3):
        t, o = random_table(rng), random_table(rng)
        for seat in (0, 1):
            pols = [to_openspiel(o), to_openspiel(o)]
            pols[seat] = to_openspiel(t)
            ref = expected_game_score.policy_value(GAME.new_initial_state(), pols)[seat]
            got = expected_chips(t, o, seat)
            assert got == pytest.approx(ref, abs=1e-12)
            p0, p1 = (t, o) if seat == 0 else (o, t)
            assert got == pytest.approx(_enumerate_value(p0, p1, seat), abs=1e-12)
    # Uniform vs uniform in OpenSpiel.
    uni = policy_lib.UniformRandomPolicy(GAME)
    ref = expected_game_score.policy_value(GAME.new_initial_state(), [uni, uni])
    assert expected_chips(uniform_policy(), uniform_policy(), 0) == pytest.approx(ref[0])


def test_evaluation_report():
    r = evaluation_report(nash_policy(1 / 6))
    assert set(r) == {"exploitability", "invalid_mass", "chips_vs_random_p0",
                      "chips_vs_random_p1", "chips_vs_nash_p0", "chips_vs_nash_p1"}
    assert r["exploitability"] < 1e-9 and r["invalid_mass"] == 0.0
    assert r["chips_vs_nash_p0"] == pytest.approx(-1 / 18)
    assert r["chips_vs_nash_p1"] == pytest.approx(1 / 18)
    # Nash beats the random policy from both seats.
    assert r["chips_vs_random_p0"] > 0 and r["chips_vs_random_p1"] > 0
    assert all(isinstance(v, float) and math.isfinite(v) for v in r.values())


def test_plot(tmp_path):
    path = tmp_path / "expl.png"
    points = [{"episodes": e, "exploitability": 0.45 / (1 + e / 100),
               "avg_exploitability": None if e == 0 else 0.4 / (1 + e / 50)}
              for e in (0, 100, 200, 400)]
    plot_exploitability(points, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_doctests():
    for module, at_least in ((kuhn, 5), (game, 10)):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0 and result.attempted >= at_least, module.__name__
