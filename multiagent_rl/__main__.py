"""``python -m multiagent_rl`` (and ``accelerate launch -m multiagent_rl``): the ``multiagent-rl`` command."""

from .cli import main

if __name__ == "__main__":
    main()
