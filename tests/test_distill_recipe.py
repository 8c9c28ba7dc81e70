"""recipes/distill_traces.py on a Kuhn poker run: rejection-sampling fine-tuning from the run's own Parquet traces,
scored by exact exploitability."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "recipes"))
import distill_traces  # noqa: E402
import kuhn_poker  # noqa: E402

from multiagent_rl.envs.kuhn_poker.exploitability import exploitability_of  # noqa: E402
from multiagent_rl.envs.kuhn_poker.evaluation import read_policy  # noqa: E402
from multiagent_rl.models import load_model_and_tokenizer  # noqa: E402
from multiagent_rl.data.traces import filter_traces, load_traces  # noqa: E402


@pytest.fixture(scope="module")
def kuhn_run(tmp_path_factory) -> Path:
    """A Kuhn run: step 0 the scripted warm-up teacher, steps 1 and 2 self-play."""
    run = tmp_path_factory.mktemp("kuhn")
    kuhn_poker.main(["--steps", "3", "--warmup-steps", "1", "--groups-per-step", "4", "--eval-every", "3",
                     "--save-every", "0", "--output-dir", str(run)])
    return run


def test_kuhn_traces_distil_into_saved_models_scored_by_exploitability(tmp_path, kuhn_run):
    run = kuhn_run
    traces = filter_traces(load_traces([str(run / "traces")]), env="kuhn_poker", steps=(1, 2))
    won = filter_traces(traces, min_reward=1)
    assert 0 < len(won) < len(traces) and set(traces["role"]) == {"player_0", "player_1"}

    out = tmp_path / "distilled"
    summary = distill_traces.main(["--eval", "kuhn_poker", "--traces", str(run / "traces"), "--env", "kuhn_poker",
                                   "--steps", "1", "2", "--max-examples", "64", "--epochs", "1", "--batch-size", "16",
                                   "--output-dir", str(out)])
    assert summary == json.loads((out / "summary.json").read_text())
    assert summary["traces"] == len(traces) and summary["best_traces"] == len(won)
    assert summary["examples_per_condition"] == 64
    base = exploitability_of(read_policy(*load_model_and_tokenizer("tiny"), legal_choices=True))
    results = summary["results"]
    assert abs(results["base"]["exploitability"] - base) < 1e-9  # the base model, read as the harness plays it
    for name in ("sft_any", "sft_best"):  # each fine-tuned copy is a different policy, saved where it says
        assert set(results[name]) == {"exploitability", "chips_vs_nash_p0", "chips_vs_nash_p1"}
        assert abs(results[name]["exploitability"] - base) > 1e-4, name
        saved = exploitability_of(read_policy(*load_model_and_tokenizer(str(out / name)), legal_choices=True))
        assert saved == pytest.approx(results[name]["exploitability"], abs=1e-6), name
        assert summary["models"][name] == str(out / name)


def test_every_traces_flag_counts_and_only_the_policys_traces_are_distilled(tmp_path, kuhn_run):
    """Two folders given with --traces twice load together; without --env the scripted warm-up teacher's traces
    (step 0) are left out, as they are not the policy's (``--played-by any`` takes them)."""
    (shard,) = (kuhn_run / "traces" / "rank0").glob("*.parquet")  # the run's three steps, merged at its end
    assert shard.name == "steps-000000-000002.parquet"
    everything = load_traces(kuhn_run / "traces")
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    everything.filter(lambda row: row["step"] < 2).to_parquet(first / "early.parquet")
    everything.filter(lambda row: row["step"] == 2).to_parquet(second / "late.parquet")
    policy = filter_traces(everything, model="policy")
    assert set(policy["step"]) == {1, 2} and 0 < len(policy) < len(everything)

    common = ["--eval", "kuhn_poker", "--traces", str(first), "--traces", str(second), "--max-examples", "8",
              "--epochs", "0.01", "--batch-size", "8", "--output-dir", str(tmp_path / "out")]
    summary = distill_traces.main(common)
    assert summary["traces"] == len(policy)
    summary = distill_traces.main(common + ["--played-by", "any"])
    assert summary["traces"] == len(everything)


def test_proposer_solver_traces_distil_into_solvers_scored_by_held_out_accuracy(tmp_path):
    """The warm-up's scripted solver is right 30% of the time: its right answers are the best traces (taken with
    --played-by any), and every model is scored by greedy accuracy per level on the fixed held-out problems."""
    import proposer_solver

    from multiagent_rl.agents.agent import Agent, AgentConfig
    from multiagent_rl.backends import TransformersBackend
    from multiagent_rl.envs.proposer_solver.evaluation import held_out_problems, solve_accuracy

    run = tmp_path / "run"
    proposer_solver.main(["--steps", "1", "--warmup-steps", "1", "--levels", "1", "2", "--solvers", "2",
                          "--group-size", "4", "--groups-per-step", "4", "--eval-every", "1", "--output-dir", str(run)])
    summary = distill_traces.main(["--eval", "proposer_solver", "--traces", str(run / "traces"), "--played-by", "any",
                                   "--env", "proposer_solver_warmup", "--per-level", "8", "--max-examples", "16",
                                   "--epochs", "1", "--batch-size", "8", "--output-dir", str(tmp_path / "out")])
    assert summary["best_traces"] > 0 and summary["traces"] > summary["best_traces"]
    model, tokenizer = load_model_and_tokenizer("tiny")
    greedy = Agent(AgentConfig(model="policy", sampling={"temperature": 0.0, "max_new_tokens": 16}),
                   TransformersBackend(model.eval(), tokenizer))
    accuracy = solve_accuracy(greedy, held_out_problems("addition", per_level=8))
    base = summary["results"]["base"]
    assert {k: base[k] for k in base if k != "mean"} == {f"level_{level}": accuracy[level] for level in accuracy}
    assert set(summary["results"]["sft_best"]) == set(base)
