"""Episodes: what playing produces. One token-level [`Trace`][multiagent_rl.episodes.trace.Trace] per finished agent
run (segments, rewards, the per-token streams an algorithm writes), gathered into an
[`Episode`][multiagent_rl.episodes.episode.Episode]."""

from .episode import Episode
from .trace import RewardRecord, Segment, TokenStreams, Trace

__all__ = ["Episode", "RewardRecord", "Segment", "TokenStreams", "Trace"]
