"""The recipes' command lines: every --help shows the defaults, every training recipe can push to the Hub, and the
env labels follow one rule (``<env id>_warmup`` for a warm-up entry, the env id for the trained one)."""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "recipes"))

TRAINING = ["kuhn_poker", "leduc_poker", "user_sim", "proposer_solver", "agentic_judge"]


def help_text(name: str, capsys) -> str:
    recipe = importlib.import_module(name)
    with pytest.raises(SystemExit) as done:
        (recipe.parse if name == "kuhn_poker" else recipe.main)(["--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("name, flag, default", [
    ("user_sim", "--lr", "0.001"), ("leduc_poker", "--entropy-coef", "0.3"), ("proposer_solver", "--levels", "[1, 2, 3"),
    ("agentic_judge", "--reward", "judge"), ("distill_traces", "--min-reward", "1.0")])
def test_help_shows_the_defaults_and_keeps_the_description(name, flag, default, capsys):
    text = help_text(name, capsys)
    options = text.split("options:", 1)[1]
    entry = options.split(flag, 1)[1].split("\n  -", 1)[0]
    assert f"(default: {default}" in " ".join(entry.split()), entry
    description = importlib.import_module(name).__doc__.strip().splitlines()[2]
    assert description in text  # the description's layout kept (its command examples)


@pytest.mark.parametrize("name", TRAINING)
def test_every_training_recipe_pushes_to_the_hub_on_request(name, capsys):
    text = " ".join(help_text(name, capsys).split())
    assert "--push-to-hub REPO" in text and "REPO-traces" in text and "--public" in text


def labels(config) -> list[str]:
    from multiagent_rl.config import env_labels

    return env_labels(config)


def test_env_labels_are_the_env_id_and_its_warmup():
    import kuhn_poker
    import leduc_poker
    import proposer_solver
    import user_sim

    from multiagent_rl.config import ExperimentConfig

    args, _ = kuhn_poker.parse([])
    assert labels(kuhn_poker.experiment(args)) == ["kuhn_poker_warmup", "kuhn_poker"]
    common = {"model": "tiny", "steps": 10, "warmup_steps": 2, "group_size": 2, "groups_per_step": 1, "lr": 1e-3,
              "warmup_lr": 1e-3, "seed": 0, "output_dir": "x", "report_to": [], "lora": None, "micro_batches": 1,
              "async_rollouts": 0}
    leduc = leduc_poker.parse([])
    assert labels(ExperimentConfig.model_validate(leduc_poker.experiment(leduc))) == ["leduc_poker_warmup",
                                                                                      "leduc_poker"]
    users = argparse.Namespace(**common, patience=0.3, max_turns=6, log_every=1, free_text=False, user="scripted",
                               user_temperature=0.7, reply_tokens=24, temperature=1.0, partial_credit=0.0,
                               learners="shared")
    assert labels(user_sim.experiment(users)) == ["user_sim_warmup", "user_sim"]
    users.user = "model"  # a model-played user in RL; the warm-up imitates its teacher against the scripted user
    users.partial_credit = 0.5  # --partial-credit reaches the env
    warm, rl = user_sim.experiment(users).env
    assert warm.roles["user"].model == "scripted" and rl.roles["user"].model == "tiny" and not rl.roles["user"].trainable
    assert rl.args["partial_credit"] == 0.5
    users.user = "trained"  # the policy plays the user too, rewarded as a user
    shared = user_sim.experiment(users)
    assert shared.env[1].roles["user"].model == "policy" and shared.env[1].roles["user"].trainable
    assert shared.env[1].args["user_reward"] and not shared.env[0].args.get("user_reward")
    users.learners = "separate"  # two learners: full models without --lora
    separate = user_sim.experiment(users)
    assert separate.uses_full_models and separate.policy_names() == ["assistant", "user"]
    assert [separate.policy_of_seat(separate.env[1], r) for r in ("assistant", "user")] == ["assistant", "user"]
    assert separate.env[0].roles["assistant"].learner == "assistant"
    users.user = "model"
    with pytest.raises(SystemExit, match="--user trained"):
        user_sim.experiment(users)
    ps = argparse.Namespace(**common, levels=[1, 2], topic="addition", solvers=2, proposer="trained",
                            probe_weight=0.25, warmup_solver_accuracy=0.3, entropy_coef=0.0, log_every=1, save_every=0,
                            free_text=False, temperature=1.0, learners="shared")
    # the two trained entries keep their names (the proposer-solver evaluation reads its metrics by them)
    assert labels(proposer_solver.experiment(ps)) == ["proposer_solver_warmup", "curriculum", "uniform_probe"]


def test_kuhn_opponents_and_proposer_solver_learners_bind_the_seats():
    import kuhn_poker
    import proposer_solver

    for rule in ("uniform", "pfsp"):
        config = kuhn_poker.experiment(kuhn_poker.parse(["--opponents", "pool", "--pool-rule", rule,
                                                         "--snapshot-every", "25"])[0])
        assert labels(config) == ["kuhn_poker_warmup", "kuhn_vs_pool_p0", "kuhn_vs_pool_p1"]
        assert config.policies["policy"].snapshot_every == 25 and config.policies["policy"].snapshot_start == 100
        seats = [{r: (rc.model, rc.pool.rule if rc.pool else None) for r, rc in e.roles.items()} for e in config.env[1:]]
        assert seats == [{"player_1": ("pool:policy", rule)}, {"player_0": ("pool:policy", rule)}]
        assert config.phase[1].envs == ["kuhn_vs_pool_p0", "kuhn_vs_pool_p1"]
    average = kuhn_poker.experiment(kuhn_poker.parse(["--opponents", "average"])[0])
    assert [rc.policy for e in average.env[1:] for rc in e.roles.values()] == [kuhn_poker.AVERAGE_OPPONENT] * 2
    assert not kuhn_poker.experiment(kuhn_poker.parse([])[0]).policies  # the default is unchanged: self-play

    import leduc_poker

    from multiagent_rl.config import ExperimentConfig

    leduc = ExperimentConfig.model_validate(leduc_poker.experiment(leduc_poker.parse(
        ["--opponents", "pool", "--pool-rule", "latest", "--magnet-coef", "0.3", "--entropy-coef", "0"])))
    assert labels(leduc) == ["leduc_poker_warmup", "leduc_vs_pool_p0", "leduc_vs_pool_p1"]
    assert [(r, rc.model, rc.pool.rule) for e in leduc.env[1:] for r, rc in e.roles.items()] == [
        ("player_1", "pool:policy", "latest"), ("player_0", "pool:policy", "latest")]
    assert leduc.policies["policy"].snapshot_start == 100 and leduc.phase[1].envs == labels(leduc)[1:]
    assert [(g.type, g.coef) for g in leduc.regulariser] == [("magnet", 0.3)]
    average = ExperimentConfig.model_validate(leduc_poker.experiment(leduc_poker.parse(["--opponents", "average"])))
    assert [rc.policy for e in average.env[1:] for rc in e.roles.values()] == [leduc_poker.AVERAGE_OPPONENT] * 2
    assert not ExperimentConfig.model_validate(leduc_poker.experiment(leduc_poker.parse([]))).policies

    common = {"model": "tiny", "steps": 10, "warmup_steps": 2, "group_size": 2, "groups_per_step": 1, "lr": 1e-3,
              "warmup_lr": 1e-3, "seed": 0, "output_dir": "x", "report_to": [], "lora": 8, "micro_batches": 1, "async_rollouts": 0}
    ps = argparse.Namespace(**common, levels=[1, 2], topic="addition", solvers=2, proposer="trained",
                            probe_weight=0.25, warmup_solver_accuracy=0.3, entropy_coef=0.0, log_every=1, save_every=0,
                            free_text=False, temperature=1.0, learners="separate")
    config = proposer_solver.experiment(ps)
    assert config.policy_names() == ["proposer", "solver"]
    bound = {(e.name, r): config.policy_of_seat(e, r) if rc.model == "policy" else rc.learner
             for e in config.env for r, rc in e.roles.items() if rc.model == "policy" or rc.learner}
    assert bound == {("proposer_solver_warmup", "proposer"): "proposer", ("proposer_solver_warmup", "solver"): "solver",
                     ("curriculum", "proposer"): "proposer", ("curriculum", "solver"): "solver",
                     ("uniform_probe", "solver"): "solver"}
    assert config.uses_adapters and not config.uses_full_models
    full = proposer_solver.experiment(argparse.Namespace(**{**vars(ps), "lora": None}))  # no --lora: two full models
    assert full.uses_full_models and [full.policy_base(n) for n in full.policy_names()] == ["tiny", "tiny"]


def test_proposer_solver_free_text_drops_the_menu_and_checks_answers():
    import proposer_solver

    common = {"model": "smollm2-135m", "steps": 10, "warmup_steps": 0, "group_size": 2, "groups_per_step": 1,
              "lr": 1e-4, "warmup_lr": 1e-3, "seed": 0, "output_dir": "x", "report_to": [], "lora": 16,
              "micro_batches": 1, "async_rollouts": 0}
    ps = argparse.Namespace(**common, levels=[1, 2], topic="addition", solvers=2, proposer="trained",
                            probe_weight=0.25, warmup_solver_accuracy=0.3, entropy_coef=0.0, log_every=1, save_every=0,
                            free_text=True, temperature=0.7, learners="shared")
    config = proposer_solver.experiment(ps)
    assert [e.name for e in config.env] == ["curriculum", "uniform_probe"]  # no warm-up entry
    ps.warmup_steps = 3  # a warm-up in free text teaches the proposer's JSON alone
    warm = proposer_solver.experiment(ps).env[0]
    assert warm.roles["proposer"].algo.type == "sft" and warm.roles["solver"].trainable is False
    ps.warmup_steps = 0
    for entry in config.env:
        assert entry.args["menu"] is False and entry.args["verify"] is True and entry.args["prompts"] == "instructed"
    assert config.trainer["temperature"] == 0.7


def test_the_docs_say_how_to_push_and_how_traces_are_written():
    text = (ROOT / "docs" / "training.md").read_text()
    section = text.split("## The episode log", 1)[1].split("\n## ", 1)[0]
    for needed in ("--push-to-hub REPO", "REPO-traces", "private", "--public", "steps_per_shard", "schema version",
                   'model == "policy"', "env_id", "--played-by"):
        assert needed in section, needed
    assert not re.search(r"kuhn_selfplay|kuhn_warmup|\bdialogue\b", section)


def test_every_measurement_of_the_proposer_solver_summary_is_explained():
    import proposer_solver

    args = argparse.Namespace(warmup_steps=1)
    rows = [{"step": 2, "curriculum/learnability": 0.5, "uniform_probe/learnability": 0.0, "curriculum/valid": 1.0}]
    summary = proposer_solver.summarize(rows, [], [1, 2], args, validity=0.0)
    assert summary["learnability_ratio"] is None  # the probe's learnability is 0: no ratio, and the key says so
    explained = {k.strip() for key in summary["explained"] for k in key.split(",")}
    assert set(summary) - {"explained"} == explained


def test_proposer_solver_free_text_measures_before_and_after(tmp_path):
    """--free-text on the tiny model (it cannot write the JSON, which is the point: the numbers are measured, not
    assumed): validity before training and after the last step, held-out accuracy at step 0 and at the end."""
    import proposer_solver
    import torch

    torch.set_num_threads(1)
    summary = proposer_solver.main(["--free-text", "--steps", "1", "--levels", "1", "2", "--solvers", "2",
                                    "--group-size", "2", "--groups-per-step", "2", "--eval-every", "1",
                                    "--output-dir", str(tmp_path / "run")])
    assert summary["held_out_first"]["step"] == 0 and summary["held_out_last"]["step"] == 1
    assert 0.0 <= summary["validity_after_warmup"] <= 1.0 and 0.0 <= summary["validity_at_end"] <= 1.0
    assert [p["step"] for p in summary["held_out"]] == [0, 1]


def test_agentic_judge_train_judge_puts_the_policy_in_the_judge_seat():
    import agentic_judge

    args = argparse.Namespace(model="smollm2-135m", lora=16, train="judge", solver="policy", reward="judge",
                              judge_model="scripted", judge_tokens=128, temperature=0.7, steps=4, group_size=2,
                              groups_per_step=1, lr=1e-4, log_every=1, seed=0, output_dir="x", report_to=[],
                              warmup_steps=0, micro_batches=1, async_rollouts=0)
    config = agentic_judge.experiment(args)
    (entry,) = config.env
    assert entry.roles["judge"].model == "policy" and entry.roles["judge"].trainable is True
    assert entry.roles["solver"].model == "scripted" and entry.roles["solver"].trainable is False
    assert entry.args["judge_tokens"] == 128 and config.trainer["temperature"] == 0.7
    rows = agentic_judge.curves([{"step": 2, "agentic_judge/judge/grpo/verdict": 0.5,
                                  "agentic_judge/judge/grpo/agrees": 0.25}], "judge")
    assert rows == [{"step": 2, "verdict": 0.5, "agrees": 0.25}]
    with pytest.raises(SystemExit):
        agentic_judge.main(["--train", "judge"])  # the tiny model cannot hold the judge's prompt: refused
    # A warm-up: the scripted examples judge sits in the judge's seat for its steps and is imitated (sft); then
    # the policy judges, with a fresh optimizer.
    args.warmup_steps = 3
    warm, rl = agentic_judge.experiment(args).env
    assert warm.name == "agentic_judge_warmup" and warm.roles["judge"].model == "scripted"
    assert warm.roles["judge"].algo.type == "sft" and warm.roles["solver"].trainable is False
    assert (warm.start_step, warm.stop_step, rl.start_step, rl.stop_step) == (0, 3, 3, None)
    assert rl.roles["judge"].model == "policy"
    for flags in (["--warmup-steps", "2"], ["--train", "judge", "--model", "smollm2-135m", "--warmup-steps", "4",
                                            "--steps", "4"]):
        with pytest.raises(SystemExit):
            agentic_judge.main(flags)


def test_micro_batches_become_gradient_accumulation_steps(monkeypatch):
    import kuhn_poker
    import user_sim

    args, _ = kuhn_poker.parse(["--micro-batches", "4", "--async-rollouts", "1"])
    trainer = kuhn_poker.experiment(args).trainer
    assert trainer["gradient_accumulation_steps"] == 4 and trainer["async_rollouts"] == 1
    built = []

    def trainer(config, callbacks=None):
        built.append(config)
        raise SystemExit(0)

    monkeypatch.setattr(user_sim, "MixedAlgorithmTrainer", trainer)
    with pytest.raises(SystemExit):
        user_sim.main(["--micro-batches", "3", "--steps", "2", "--warmup-steps", "1"])
    assert built[0].trainer["gradient_accumulation_steps"] == 3
