"""Evaluation utilities. ``multiagent_rl.eval.kuhn``: exact Kuhn poker evaluation via OpenSpiel."""
