"""``python -m multiagent_rl`` (and ``accelerate launch -m multiagent_rl``): the ``multiagent-rl`` command."""

from .cli import main

main()
