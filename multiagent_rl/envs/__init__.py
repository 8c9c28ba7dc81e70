"""Environments: [`Env`][multiagent_rl.envs.base.Env] and the runner that plays many episodes at once
([`base`][multiagent_rl.envs.base]), and the built-in environments, one package each: its rules, prompts, env,
evaluation and task data side by side (``kuhn_poker/``, ``leduc_poker/``, ``proposer_solver/``, ``user_sim/``,
``agentic_judge/``)."""
