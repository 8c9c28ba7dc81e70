"""What the game environments share: the reach-weighted average policy
([`average`][multiagent_rl.games.average]), a model's tabular policy read at given contexts
([`tables`][multiagent_rl.games.tables]) and the exact-evaluation callback
([`evaluation`][multiagent_rl.games.evaluation]). Each game's own rules live in its environment package
(``multiagent_rl/envs/kuhn_poker/rules.py``)."""
