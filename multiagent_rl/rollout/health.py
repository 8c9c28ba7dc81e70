"""Run health: stop a run that cannot train instead of letting it burn compute silently.

Three conditions, each counted over consecutive training steps and judged on data that is the
same on every process (the gathered episodes, the all-reduced gradient), so every rank stops at
the same step:

- every episode an environment played failed (e.g. a scripted policy that returns an int);
- a loss stream that an environment's algorithms must feed (``Algorithm.streams_required``)
  received no tokens (e.g. ``opsd`` on tasks without demonstrations);
- the loss or the gradient was not finite, so the optimizer step was skipped (the weights never see
  a NaN; each skip is counted in the ``health/skipped_steps`` metric and warned about).

After ``limit`` such steps in a row [`RunStopped`][multiagent_rl.rollout.health.RunStopped] is raised with the cause and the
fix.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict

from ..episodes.episode import Episode

logger = logging.getLogger(__name__)


class RunStopped(RuntimeError):
    """The run cannot train as configured; the message names the cause and what to change."""


def _first_line(error: str) -> str:
    return error.strip().splitlines()[0] if error.strip() else "(no message)"


def streams_fed(episode: Episode) -> set[str]:
    """The loss streams some trace of ``episode`` puts tokens into."""
    from ..episodes.streams import STREAMS

    fed = set()
    for t in episode.traces:
        if t.streams is None or not t.trainable:
            continue
        for stream in STREAMS:
            values = getattr(t.streams, stream.field)
            if values is None:
                continue
            if any(w != 0 for w in values) or (not stream.counts_weighted_only and "action" in t.token_kinds):
                fed.add(stream.name)
    return fed


class RunHealth:
    """Counts consecutive bad steps per cause; raises [`RunStopped`][multiagent_rl.rollout.health.RunStopped] at ``limit``.

    ```pycon
    >>> health = RunHealth(failed_steps=3, skipped_steps=3)

    ```
    """

    def __init__(self, failed_steps: int = 3, skipped_steps: int = 3):
        if failed_steps < 1 or skipped_steps < 1:
            raise ValueError("failed_steps and skipped_steps must be at least 1")
        self.failed_steps, self.skipped_steps = failed_steps, skipped_steps
        self._failed: dict[str, int] = defaultdict(int)
        self._empty: dict[tuple[str, str], int] = defaultdict(int)
        self._skipped = 0
        self.total_skipped = 0
        self._flat: dict[str, int] = defaultdict(int)
        self.flat_warn_steps = failed_steps

    def after_rollout(self, episodes: list[Episode], required: dict[str, dict[str, list[str]]]) -> None:
        """Judge one step's episodes (all processes'). ``required[env][stream]`` names who needs the stream."""
        by_env: dict[str, list[Episode]] = defaultdict(list)
        for ep in episodes:
            by_env[ep.env].append(ep)
        for env, eps in by_env.items():
            if all(not ep.ok for ep in eps):
                self._failed[env] += 1
                if self._failed[env] >= self.failed_steps:
                    errors = Counter(_first_line(e) for ep in eps for e in (ep.errors or ["(no error recorded)"]))
                    error, n = errors.most_common(1)[0]
                    raise RunStopped(
                        f"every episode of env {env!r} failed in {self._failed[env]} consecutive steps "
                        f"({len(eps)} in the last one), so nothing trains. Most common error ({n}x): {error}. "
                        "Fix the environment or the seat bindings (every failed episode's errors and traceback are in the "
                        "episode log: episode_errors in output_dir/traces/, and traces/failed-rank{r}.jsonl for "
                        "those that failed before any seat finished; output_dir/episodes/ with episode_format "
                        "jsonl); "
                        "`max_failed_steps` sets how many such steps are tolerated."
                    )
            else:
                self._failed[env] = 0
            self._warn_if_flat(env, eps)
            fed = set().union(*(streams_fed(ep) for ep in eps if ep.ok))
            for stream, owners in required.get(env, {}).items():
                key = (env, stream)
                self._empty[key] = 0 if stream in fed else self._empty[key] + 1
                if self._empty[key] >= self.failed_steps:
                    raise RunStopped(
                        f"env {env!r}: the {stream} loss stream received no tokens in {self._empty[key]} consecutive "
                        f"steps, although {', '.join(owners)} train on it, so that algorithm trains nothing. "
                        "Check that the roles act in every episode and that the algorithm has what it needs "
                        "(rewards, a demonstration for opsd, a teacher for opd); `max_failed_steps` sets the limit."
                    )

    def _warn_if_flat(self, env: str, eps: list[Episode]) -> None:
        """Warn (once per streak) when every rl-scored trace of an env got advantage 0 for several steps: each group's
        rewards were all equal, so the rl loss is 0 and nothing learns from them."""
        scored = [t for ep in eps if ep.ok for t in ep.traces
                  if t.trainable and t.streams is not None and t.streams.advantages is not None]
        if not scored or any(a != 0 for t in scored for a in t.streams.advantages):
            self._flat[env] = 0
            return
        self._flat[env] += 1
        if self._flat[env] == self.flat_warn_steps:
            logger.warning("env %r: every advantage was 0 in %d consecutive steps (%d traces in the last): the rewards "
                           "are equal within each task group, so the rl loss is 0 and the policy does not move. Check "
                           "the reward (is it constant? does every episode fail the same way?), make tasks easier or "
                           "harder, or use a running baseline (rae) instead of the group mean", env, self._flat[env],
                           len(scored))

    def after_gradient(self, finite: bool, cause: str = "") -> bool:
        """Record whether this step's loss and gradient were finite; returns True when the step must be skipped."""
        if finite:
            self._skipped = 0
            return False
        self._skipped += 1
        self.total_skipped += 1
        logger.warning("skipped the optimizer step: %s (%d in a row)", cause, self._skipped)
        if self._skipped >= self.skipped_steps:
            raise RunStopped(
                f"{self._skipped} consecutive optimizer steps were skipped because {cause}; the weights are "
                "unchanged and finite. Typical causes: a reward or teacher logprob of extreme size, a learning rate "
                "too high for the model, or fp16 overflow; `max_skipped_steps` sets how many are tolerated."
            )
        return True
