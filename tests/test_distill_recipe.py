"""recipes/distill_traces.py on a Kuhn poker run: rejection-sampling fine-tuning from the run's own Parquet traces,
scored by exact exploitability."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "recipes"))
import distill_traces  # noqa: E402
import kuhn_poker  # noqa: E402

from multiagent_rl.envs.kuhn_poker.exploitability import exploitability_of  # noqa: E402
from multiagent_rl.envs.kuhn_poker.evaluation import read_policy  # noqa: E402
from multiagent_rl.models import load_model_and_tokenizer  # noqa: E402
from multiagent_rl.data.traces import filter_traces, load_traces  # noqa: E402


def test_kuhn_traces_distil_into_a_model_scored_by_exploitability(tmp_path):
    run = tmp_path / "kuhn"
    kuhn_poker.main(["--steps", "3", "--warmup-steps", "1", "--groups-per-step", "4", "--eval-every", "3",
                     "--save-every", "0", "--output-dir", str(run)])
    traces = filter_traces(load_traces([str(run / "traces")]), env="kuhn_selfplay", steps=(1, 2))
    won = filter_traces(traces, min_reward=1)
    assert 0 < len(won) < len(traces) and set(traces["role"]) == {"player_0", "player_1"}

    out = tmp_path / "distilled"
    summary = distill_traces.main(["--eval", "kuhn_poker", "--traces", str(run / "traces"), "--env", "kuhn_selfplay",
                                   "--steps", "1", "2", "--max-examples", "64", "--epochs", "1", "--batch-size", "16",
                                   "--output-dir", str(out)])
    assert summary == json.loads((out / "summary.json").read_text())
    assert summary["traces"] == len(traces) and summary["best_traces"] == len(won)
    assert summary["examples_per_condition"] == 64
    base = exploitability_of(read_policy(*load_model_and_tokenizer("tiny"), legal_choices=True))
    results = summary["results"]
    assert abs(results["base"]["exploitability"] - base) < 1e-9  # the base model, read as the harness plays it
    for name in ("sft_any", "sft_best"):  # each fine-tuned copy is a different policy
        assert set(results[name]) == {"exploitability", "chips_vs_nash_p0", "chips_vs_nash_p1"}
        assert abs(results[name]["exploitability"] - base) > 1e-4, name
