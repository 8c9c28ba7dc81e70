"""multiagent_rl: train language models in multi-agent environments on the Hugging Face stack."""

from .agents.agent import (
    Agent,
    AgentConfig,
    ChatHarnessConfig,
    Interaction,
    ScriptedTurn,
    Seat,
    TurnLimitReached,
    make_agent,
)
from .backends import Generation, GenerationBackend, SamplingParams, TransformersBackend, build_backend
from .config import ExperimentConfig
from .envs.base import Env, SingleAgentEnv, play_episodes, run_sync
from .episodes.episode import Episode
from .episodes.trace import RewardRecord, Segment, TokenStreams, Trace
from .rollout.engine import Orchestrator
from .tasks.task import Task, TaskData

__version__ = "0.1.0"

__all__ = [
    "Agent", "AgentConfig", "ChatHarnessConfig", "Env", "Episode", "ExperimentConfig", "Generation",
    "GenerationBackend", "Interaction", "Orchestrator", "RewardRecord", "SamplingParams", "ScriptedTurn", "Seat",
    "Segment", "SingleAgentEnv", "Task", "TaskData", "TokenStreams", "Trace", "TransformersBackend",
    "TurnLimitReached", "build_backend", "make_agent", "play_episodes", "run_sync",
]
