"""Programs that run inside the sandbox, never imported by the library: the host reads their source and starts them
with ``python3 -I -c`` (``codec`` is prepended to each). See [`grading`][multiagent_rl.envs.agentic_judge.grading]."""
