"""Leduc poker's rules equal OpenSpiel's ``leduc_poker`` on every deal and a large sample of action sequences."""

import random
from pathlib import Path

import pytest

from multiagent_rl.envs.leduc_poker import rules as leduc

pyspiel = pytest.importorskip("pyspiel")

GAME = pyspiel.load_game("leduc_poker")
WORDS_OF = {0: ("fold",), 1: ("check", "call"), 2: ("bet", "raise")}


def rank(card_id: int) -> str:
    return leduc.RANKS[card_id // 2]


def play(rng: random.Random, deal: tuple[int, int], public_id: int, info_map: dict):
    """One random playout in both implementations, compared at every node."""
    state = GAME.new_initial_state()
    state.apply_action(deal[0])
    state.apply_action(deal[1])
    cards = (rank(deal[0]), rank(deal[1]))
    history, public = ((), ()), None
    while not state.is_terminal():
        if state.is_chance_node():
            assert public_id in [a for a, _ in state.chance_outcomes()]
            state.apply_action(public_id)
            public = rank(public_id)
            continue
        player = state.current_player()
        assert leduc.to_act(history) == player
        mine = leduc.legal_actions(history)
        assert sorted(leduc.ACTION_IDS[w] for w in mine) == state.legal_actions()
        key = leduc.InfoState(player, cards[player], public if leduc.current_round(history) else None, history)
        assert info_map.setdefault(state.information_state_string(), key) == key  # one OpenSpiel state, one of ours
        word = rng.choice(mine)
        state.apply_action(leduc.ACTION_IDS[word])
        history = leduc.apply(history, word)
    assert leduc.is_over(history) and leduc.to_act(history) is None
    assert tuple(state.returns()) == leduc.payoff(cards, public, history)


def test_rules_equal_openspiel_on_every_deal_and_random_action_sequences():
    rng = random.Random(0)
    info_map: dict = {}
    for first in range(6):
        for second in range(6):
            if first == second:
                continue
            publics = [c for c in range(6) if c not in (first, second)]
            for _ in range(60):
                play(rng, (first, second), rng.choice(publics), info_map)
    # OpenSpiel's information states tell the suits apart (936); ours are by rank (288), suits being irrelevant to
    # the game: every OpenSpiel state maps to exactly one of ours (setdefault above), and each of ours is real
    assert set(info_map.values()) <= set(leduc.info_states())
    assert len(info_map) > len(set(info_map.values())) > 250


def test_information_states_by_rank_cover_openspiels_936():
    """Walking OpenSpiel's whole tree: 936 information-state strings, which map onto our 288 rank-based states."""
    seen: dict[str, leduc.InfoState] = {}

    def walk(state, cards, public, history):
        if state.is_terminal():
            return
        if state.is_chance_node():
            for action, _ in state.chance_outcomes():
                child = state.child(action)
                if len(cards) < 2:
                    walk(child, cards + (rank(action),), public, history)
                else:
                    walk(child, cards, rank(action), history)
            return
        player = state.current_player()
        key = leduc.InfoState(player, cards[player], public, history)
        assert seen.setdefault(state.information_state_string(), key) == key
        for word in leduc.legal_actions(history):
            walk(state.child(leduc.ACTION_IDS[word]), cards, public, leduc.apply(history, word))

    walk(GAME.new_initial_state(), (), None, ((), ()))
    assert len(seen) == 936
    assert set(seen.values()) == set(leduc.info_states()) and len(leduc.info_states()) == 288


def test_illegal_actions_are_refused_and_payoffs_match_the_examples():
    with pytest.raises(ValueError, match="not legal"):
        leduc.apply(((), ()), "fold")
    h = (("bet", "raise", "call"), ("bet", "call"))
    assert leduc.contributions(h) == (9, 9)
    assert leduc.payoff(("Q", "K"), "Q", h) == (9, -9)  # a pair beats a higher card
    assert leduc.payoff(("J", "J"), "K", h) == (0, 0)  # equal ranks split
    assert leduc.payoff(("K", "Q"), "J", (("bet", "raise", "fold"), ())) == (-3, 3)


def test_the_env_plays_the_rules_and_rewards_every_decision_with_the_hands_chips():
    import multiagent_rl as mrl
    from multiagent_rl.envs.leduc_poker import LeducPokerEnv, random_mixed_policy

    env = LeducPokerEnv()
    seat = lambda: mrl.make_agent(mrl.AgentConfig(model="scripted", policy=random_mixed_policy(3)))  # noqa: E731
    episodes = mrl.run_sync(mrl.play_episodes(env, env.sample_tasks(40, random.Random(0)),
                                              {"player_0": seat(), "player_1": seat()}, seed="0",
                                              trainable={"player_0": True, "player_1": True}))
    for ep in episodes:
        assert ep.ok, ep.errors
        info = ep.traces[0].info
        history = tuple(tuple(r) for r in info["history"])
        chips = leduc.payoff(tuple(info["cards"]), info["public"], history)
        assert sum(len(r) for r in history) == len(ep.traces)  # one trace per decision
        for trace in ep.traces:
            player = int(trace.role[-1])
            assert trace.reward == chips[player]
            prompt = trace.messages[0]["content"]
            assert prompt.endswith(f"Your card: {info['cards'][player]}.")
            assert f"Your card: {info['cards'][1 - player]}" not in prompt or info["cards"][0] == info["cards"][1]
            if "Public card" in prompt:
                assert f"Public card: {info['public']}." in prompt


def test_exploitability_and_the_reach_weighted_average():
    from open_spiel.python import policy as policy_lib
    from open_spiel.python.algorithms import exploitability

    from multiagent_rl.envs.leduc_poker.evaluation import exploitability_of, uniform_table
    from multiagent_rl.envs.leduc_poker.rules import AveragePolicy, own_reach

    assert exploitability_of(uniform_table()) == pytest.approx(
        exploitability.exploitability(GAME, policy_lib.UniformRandomPolicy(GAME)), abs=1e-12)
    bold = {s: {a: (0.9 if a in ("bet", "raise") else 0.1) for a in row} for s, row in uniform_table().items()}
    bold = {s: {a: p / sum(row.values()) for a, p in row.items()} for s, row in bold.items()}
    root, after_bet = leduc.InfoState(0, "K", None, ((), ())), leduc.InfoState(0, "K", None, (("bet", "raise"), ()))
    assert own_reach(bold, after_bet) == pytest.approx(0.9) and own_reach(bold, root) == 1.0
    avg = AveragePolicy()
    avg.add(uniform_table())
    avg.add(bold)
    assert len(avg) == 2
    assert avg.table()[root]["bet"] == pytest.approx((0.5 + 0.9) / 2)  # reach 1 for both snapshots
    # after its own bet: each snapshot's row weighted by its own reach (0.5 for uniform, 0.9 for bold)
    u, b = uniform_table()[after_bet], bold[after_bet]
    expected = (0.5 * u["call"] / sum(u.values()) + 0.9 * b["call"] / sum(b.values())) / (0.5 + 0.9)
    assert avg.table()[after_bet]["call"] == pytest.approx(expected)
    again = AveragePolicy()
    again.load_state_dict(avg.state_dict())
    assert again.table() == avg.table()


def test_the_tiny_models_policy_is_read_at_every_information_state(tiny):
    from multiagent_rl.envs.leduc_poker.evaluation import exploitability_of, read_policy

    model, tokenizer = tiny
    table = read_policy(model, tokenizer)
    assert set(table) == set(leduc.info_states())
    assert all(abs(sum(row.values()) - 1) < 1e-4 for row in table.values())  # the harness's restricted softmax
    assert 0 < exploitability_of(table) < 5


def test_the_recipe_runs_end_to_end_and_scores_the_policy_exactly(tmp_path):
    import sys

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "recipes"))
    import leduc_poker as recipe

    torch.set_num_threads(1)
    summary = recipe.main(["--steps", "3", "--warmup-steps", "1", "--groups-per-step", "1", "--group-size", "2",
                           "--eval-every", "3", "--fresh-optimizer", "--output-dir", str(tmp_path)])
    assert summary["steps"] == 3 and not summary["interrupted"]
    # the exact exploitability of what the model plays: between Nash (0) and the warm-up's bold teacher (~3.3)
    assert 0 < summary["final_exploitability"] < 4
    assert (tmp_path / "summary.json").exists()


def test_the_average_opponent_plays_the_evaluations_reach_weighted_average():
    from types import SimpleNamespace

    from multiagent_rl.envs.leduc_poker import random_mixed_table, table_policy
    from multiagent_rl.envs.leduc_poker.evaluation import uniform_table
    from multiagent_rl.envs.leduc_poker.rules import AveragePolicy
    from multiagent_rl.games.evaluation import AverageOpponent

    bold, meek = random_mixed_table(seed=1, low=0.9, high=0.9), random_mixed_table(seed=1, low=0.1, high=0.1)
    opponent = AverageOpponent(table_policy, bold)
    root = leduc.InfoState(0, "K", None, ((), ()))
    rng = random.Random(0)

    def bet_share(n=4000):
        return sum(opponent(SimpleNamespace(state={"info_state": root}, rng=rng)) == "bet" for _ in range(n)) / n

    assert bet_share() == pytest.approx(0.9, abs=0.02)  # no evaluation yet: the start table
    evaluation = SimpleNamespace(average=AveragePolicy())
    opponent.evaluation = evaluation
    assert bet_share() == pytest.approx(0.9, abs=0.02)  # an empty average: still the start table
    evaluation.average.add(meek)
    assert bet_share() == pytest.approx(0.1, abs=0.02)  # a point joined: the average is re-read
    evaluation.average.add(uniform_table(), weight=3.0)
    expected = evaluation.average.table()[root]["bet"]
    assert expected == pytest.approx((0.1 + 3 * 0.5) / 4)
    assert bet_share() == pytest.approx(expected, abs=0.02)
