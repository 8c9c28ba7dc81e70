"""Agents: a harness × a model × sampling, and the seats an environment plays them through.

[`make_agent`][multiagent_rl.agents.agent.make_agent] builds an agent from an
[`AgentConfig`][multiagent_rl.agents.agent.AgentConfig]; the harness (``chat``, ``tools``, the legal-action choices)
decides how a conversation becomes tokens ([`chat_template`][multiagent_rl.agents.chat_template]); the model behind
it is a generation backend ([`multiagent_rl.backends`][]).
"""

from .agent import Agent, AgentConfig, ChatHarnessConfig, Interaction, ScriptedTurn, Seat, TurnLimitReached, make_agent

__all__ = ["Agent", "AgentConfig", "ChatHarnessConfig", "Interaction", "ScriptedTurn", "Seat", "TurnLimitReached",
           "make_agent"]
