"""Rollouts ahead of training (``async_rollouts``): the lag bound, the weights each rollout samples, the importance
correction of lagged batches, and the same tasks in the same steps as an on-policy run."""

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from multiagent_rl.training.rollouts_ahead import RolloutsAhead


class _Orchestrator:
    """Records, per step, the weights the rollout's copy held (its one parameter's value) when it played."""

    def __init__(self, copy_holder, delay):
        self.policies, self.pools, self.delay, self.holder = {}, {}, delay, copy_holder
        self.played, self.threads = {}, set()

    def state_dict(self):
        return {"rollouts drawn": len(self.played)}

    async def aplay(self, step):
        self.threads.add(threading.current_thread().name)
        self.played[step] = float(self.holder["ahead"].copy.weight.item())
        time.sleep(self.delay)
        return [f"episode of step {step}"]


@pytest.mark.parametrize("max_lag,rollout_seconds,train_seconds", [(1, 0.0, 0.01), (2, 0.0, 0.01), (1, 0.02, 0.0),
                                                                   (3, 0.01, 0.01)])
def test_each_rollout_samples_published_weights_at_most_max_lag_steps_old(max_lag, rollout_seconds, train_seconds):
    live = torch.nn.Linear(1, 1, bias=False)
    holder = {}
    orchestrator = _Orchestrator(holder, rollout_seconds)
    ahead = holder["ahead"] = RolloutsAhead(orchestrator, live, max_lag, max_steps=12)
    lags = []
    for step in range(12):
        with torch.no_grad():
            live.weight.fill_(step)  # the weights at the start of step `step` are `step`
        episodes, lag = ahead.episodes(step)
        assert episodes == [f"episode of step {step}"]
        # a checkpoint now holds the state from before this step's rollout drew, whatever the thread played since
        assert ahead.rollout_state(step) == {"rollouts drawn": step}
        lags.append(lag)
        assert orchestrator.played[step] == step - lag  # it sampled exactly the weights published lag steps ago
        time.sleep(train_seconds)
        with torch.no_grad():
            live.weight.add_(0.5)  # the optimizer step: never seen by a rollout (only published weights are)
    ahead.close()
    assert max(lags) <= max_lag and lags[0] == 0
    if rollout_seconds == 0:  # rollouts faster than training run as far ahead as allowed
        assert lags[max_lag:] == [max_lag] * (12 - max_lag)
    assert orchestrator.threads == {t for t in orchestrator.threads if t.startswith("rollouts-ahead")}
    assert sorted(orchestrator.played) == list(range(12))  # no step played twice, none past the last


def test_close_cancels_the_rollout_in_flight_instead_of_waiting_for_it():
    live = torch.nn.Linear(1, 1, bias=False)
    holder, cancelled = {}, threading.Event()

    class SlowOrchestrator(_Orchestrator):
        async def aplay(self, step):
            if step == 0:
                return ["episode of step 0"]
            try:
                await asyncio.sleep(60)  # a real model's rollout: minutes
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return [f"episode of step {step}"]

    ahead = holder["ahead"] = RolloutsAhead(SlowOrchestrator(holder, 0.0), live, max_lag=1, max_steps=12)
    assert ahead.episodes(0)[0] == ["episode of step 0"]  # and step 1's rollout starts in the thread
    time.sleep(0.2)
    start = time.perf_counter()
    ahead.close()  # the run ends (or Ctrl-C) while step 1 is being played
    assert time.perf_counter() - start < 5 and cancelled.is_set()


def test_async_rollouts_train_kuhn_on_the_same_tasks_with_lagged_corrected_batches(tmp_path):
    from multiagent_rl.data.traces import load_traces
    from multiagent_rl.training.trainer import MixedAlgorithmConfig, MixedAlgorithmTrainer

    def run(name, async_rollouts):
        experiment = {"env": [{"id": "kuhn_poker", "group_size": 4, "args": {"legal_choices": True}}]}
        args = MixedAlgorithmConfig(output_dir=str(tmp_path / name), max_steps=5, groups_per_step=4, seed=3,
                                    async_rollouts=async_rollouts, report_to=[], save_strategy="no",
                                    logging_steps=1, learning_rate=1e-2, max_completion_length=4)
        trainer = MixedAlgorithmTrainer(experiment, args=args)
        trainer.train()
        return trainer

    on_policy, ahead = run("sync", 0), run("async", 1)
    lags = [h["rollout/lag"] for h in ahead.state.log_history if "rollout/lag" in h]
    assert lags == [0.0, 1.0, 1.0, 1.0, 1.0]  # tiny rollouts finish before the step trains: always one step ahead
    assert not any("rollout/lag" in h for h in on_policy.state.log_history)
    # lagged steps are weighed by the truncated importance ratio; the on-policy transformers run needs none
    corrected = [h for h in ahead.state.log_history if any(k.startswith("sampling/") for k in h)]
    assert len(corrected) == 4 and not any(any(k.startswith("sampling/") for k in h) for h in on_policy.state.log_history)
    # the same deals in the same steps: the tasks come from the run's seeded stream, whichever thread draws them
    tasks = [sorted((r["step"], r["task"]["info"], r["role"]) for r in load_traces(tmp_path / n / "traces"))
             for n in ("sync", "async")]
    assert tasks[0] == tasks[1]
    # evaluations between steps read the live weights, not the rollouts' copy
    assert ahead.live_policy().model is ahead.accelerator.unwrap_model(ahead.model)
    assert ahead.rollout.policy.model is ahead.ahead.copy


def test_async_rollouts_are_refused_where_they_cannot_hold(tmp_path):
    from multiagent_rl.training.trainer import MixedAlgorithmConfig

    with pytest.raises(ValueError, match="one rollout per optimizer step"):
        MixedAlgorithmConfig(output_dir=str(tmp_path), max_steps=2, async_rollouts=1, num_iterations=2)
    with pytest.raises(ValueError, match="async_rollouts=-1"):
        MixedAlgorithmConfig(output_dir=str(tmp_path), max_steps=2, async_rollouts=-1)
    with pytest.raises(ValueError, match="opponent pools"):
        RolloutsAhead(SimpleNamespace(policies={}, pools={"policy": object()}), torch.nn.Linear(1, 1), 1, 5)
