"""Evaluation: scoring policies exactly (``kuhn``: OpenSpiel exploitability of Kuhn poker tables) and reading a
language model's policy during training (``kuhn_policy``: ``read_policy``, ``KuhnEvaluation``, the plot)."""
