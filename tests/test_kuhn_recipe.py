"""The Kuhn poker recipe with --config: flags given on the command line win, evaluation counts every Kuhn env."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "recipes"))
import kuhn_poker as recipe  # noqa: E402

CONFIG = """
[algo]
type = "grpo"

[[env]]
id = "kuhn_poker"
name = "my_kuhn"
group_size = 4

[trainer]
max_steps = 100
learning_rate = 1e-5
groups_per_step = 2
seed = 3
"""


@pytest.fixture
def config_file(tmp_path) -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(CONFIG)
    return path


def test_flags_given_with_config_are_written_over_the_file(config_file, tmp_path):
    args, given = recipe.parse(["--config", str(config_file), "--steps", "3", "--algo", "max_rl", "--lr", "1e-3",
                                "--report-to", "--output-dir", str(tmp_path / "out")])
    config = recipe.from_file(str(config_file), args, given)
    assert config.trainer["max_steps"] == 3 and config.trainer["learning_rate"] == 1e-3
    assert config.trainer["report_to"] == [] and config.trainer["output_dir"] == str(tmp_path / "out")
    assert config.trainer["seed"] == 3 and config.trainer["groups_per_step"] == 2  # not given: the file's
    assert config.algo.type == "max_rl" and config.env[0].args["reward"] == "unit"  # max_rl gets rewards in [0, 1]
    args, given = recipe.parse(["--config", str(config_file)])
    config = recipe.from_file(str(config_file), args, given)
    assert config.trainer["max_steps"] == 100 and config.algo.type == "grpo"
    with pytest.raises(SystemExit, match="--warmup-steps cannot be combined with --config"):
        args, given = recipe.parse(["--config", str(config_file), "--warmup-steps", "5"])
        recipe.from_file(str(config_file), args, given)
    with pytest.raises(SystemExit, match="--magnet-coef cannot be combined with --config"):  # a phase setting
        args, given = recipe.parse(["--config", str(config_file), "--magnet-coef", "0.5"])
        recipe.from_file(str(config_file), args, given)


def test_evaluation_counts_invalid_replies_in_every_kuhn_env(config_file, tmp_path):
    torch.set_num_threads(1)
    out = tmp_path / "run"
    summary = recipe.main(["--config", str(config_file), "--steps", "2", "--eval-every", "1", "--save-every", "0",
                           "--report-to", "--output-dir", str(out)])
    # free text on the untrained tiny model: invalid replies happen, in an env labelled "my_kuhn"
    assert summary["legal_choices"] is False and summary["steps"] == 2
    assert summary["curve"][-1]["decisions"] > 0
    assert summary["final_invalid_reply_rate"] > 0
    assert json.loads((out / "summary.json").read_text())["final_invalid_reply_rate"] == summary["final_invalid_reply_rate"]


def test_the_learning_rate_decays_linearly_to_the_final_ratio_after_the_warmup_rate(tmp_path):
    torch.set_num_threads(1)
    out = tmp_path / "run"
    recipe.main(["--steps", "8", "--warmup-steps", "2", "--groups-per-step", "1", "--group-size", "2",
                 "--eval-every", "2", "--magnet-every", "2", "--final-lr-ratio", "0.25", "--lr", "4e-4",
                 "--save-every", "8", "--output-dir", str(out)])
    history = json.loads((out / "checkpoint-8" / "trainer_state.json").read_text())["log_history"]
    logged = {h["step"]: h["learning_rate"] for h in history if "learning_rate" in h}
    # the rate step s (from 1) ran at: 4e-4 - (4e-4 - 1e-4) * (s - 1) / 8, reaching 1e-4 where training ends
    for step in (4, 6, 8):
        assert logged[step] == pytest.approx(4e-4 - 3e-4 * (step - 1) / 8), (step, logged)
    with pytest.raises(SystemExit):
        recipe.parse(["--final-lr-ratio", "1.5"])
    args, _ = recipe.parse(["--magnet-coef", "0"])  # the entropy-bonus setting of the earlier results: constant
    assert recipe.experiment(args).trainer["lr_scheduler_type"] == "constant"


def test_the_rl_phase_starts_with_a_fresh_optimizer_state(tmp_path):
    torch.set_num_threads(1)
    out = tmp_path / "run"
    recipe.main(["--steps", "5", "--warmup-steps", "2", "--groups-per-step", "1", "--group-size", "2",
                 "--eval-every", "5", "--save-every", "5", "--output-dir", str(out)])
    state = torch.load(out / "checkpoint-5" / "optimizer.pt", weights_only=False)["state"]
    # Adam's step count restarted where the warm-up handed over: 3 RL steps, not 5
    assert state and {int(s["step"]) for s in state.values()} == {3}
    # the warm-up check ran at its last step: two sft steps teach little, so the gap to the teacher is large
    check = json.loads((out / "summary.json").read_text())["warmup_check"]
    assert 0.2 < check["max_gap"] <= 0.9 and check["worst"].startswith("player ")


def test_the_warmup_check_names_each_decision_point_where_the_policy_does_not_read_its_card():
    from multiagent_rl.envs.kuhn_poker import random_mixed_table
    from multiagent_rl.envs.kuhn_poker.evaluation import imitation_report
    from multiagent_rl.envs.kuhn_poker.rules import INFO_STATES

    teacher = random_mixed_table(seed=3, low=0.1, high=0.9, two_point=True)  # seed 3: its player 1 rows differ by card
    assert imitation_report(teacher, teacher) == {"max_gap": 0.0, "worst": "player 0 with J after the deal",
                                                  "card_blind": []}
    blind = {s: dict(teacher[s]) for s in INFO_STATES}
    for s in INFO_STATES:
        if s.player == 1:  # every card plays the teacher's average at its decision point: the card is ignored
            mean = sum(teacher[t][t.legal_actions[1]] for t in INFO_STATES if t.history == s.history) / 3
            blind[s] = {s.legal_actions[0]: 1 - mean, s.legal_actions[1]: mean}
    report = imitation_report(blind, teacher)
    assert [(b["player"], b["history"]) for b in report["card_blind"]] == [(1, ["check"]), (1, ["bet"])]
    assert report["card_blind"][0]["teacher"] == [0.9, 0.9, 0.1]
    # the largest gap: K after a check plays the mean 0.633 where the teacher bets with 0.1
    assert report["max_gap"] == 0.5333 and report["worst"] == "player 1 with K after check"


def test_the_fresh_optimizer_refuses_deepspeed_however_it_was_configured(monkeypatch):
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from multiagent_rl.training import callbacks

    # an `accelerate launch` DeepSpeed config sets the accelerator's state, not TrainingArguments.deepspeed
    monkeypatch.setattr(callbacks, "AcceleratorState", lambda: SimpleNamespace(distributed_type=DistributedType.DEEPSPEED))
    with pytest.raises(ValueError, match="DeepSpeed"):
        callbacks.FreshOptimizerState([1]).on_train_begin(SimpleNamespace(deepspeed=None), None, None)


def test_eval_at_start_scores_the_untrained_policy_before_the_first_step(config_file, tmp_path):
    """The step-0 point is the untrained model's exact exploitability (read here from a fresh load of the embedded
    model); nothing has been played yet, so it has no invalid-reply rate."""
    from multiagent_rl.envs.kuhn_poker.evaluation import exploitability_of, read_policy
    from multiagent_rl.models import load_model_and_tokenizer

    torch.set_num_threads(1)
    out = tmp_path / "run"
    summary = recipe.main(["--config", str(config_file), "--steps", "1", "--eval-every", "1", "--save-every", "0",
                           "--eval-at-start", "--report-to", "--output-dir", str(out)])
    before = summary["before"]
    assert before["step"] == 0 and before["episodes"] == 0 and before["invalid_reply_rate"] is None
    assert [p["step"] for p in summary["curve"]] == [0, 1]
    model, tokenizer = load_model_and_tokenizer("tiny")
    assert before["exploitability"] == pytest.approx(exploitability_of(read_policy(model, tokenizer)), abs=1e-6)
