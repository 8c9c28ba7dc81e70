"""The multiagent-rl command: every shipped experiment trains from its TOML file with dotted overrides, under
python -m too; a saved model is evaluated by its env's own evaluation."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from multiagent_rl import cli
from multiagent_rl.envs.kuhn_poker import KuhnPokerEnv
from multiagent_rl.tools.sandbox import bwrap_available

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "recipes" / "configs").glob("*.toml"))


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_every_shipped_config_trains_two_steps_from_the_command(config, tmp_path):
    if "agentic_judge" in config.stem and not bwrap_available():
        pytest.skip("bubblewrap cannot start here (CI installs it)")
    summary = cli.main(["train", str(config), "--set", "trainer.max_steps=2", "--set", "trainer.groups_per_step=2",
                        "--set", f"trainer.output_dir={json.dumps(str(tmp_path / 'run'))}",
                        "--set", "trainer.logging_steps=1", "--set", "trainer.report_to=[]"])
    assert summary["steps"] == 2 and summary["episodes"] > 0
    assert (tmp_path / "run" / "final_model" / "config.json").exists()
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 2


def test_overrides_reach_lists_and_tables_and_name_a_bad_key(tmp_path):
    data = {"env": [{"id": "kuhn_poker", "args": {}}], "trainer": {}}
    cli.apply_override(data, "env.0.args.legal_choices=true")
    cli.apply_override(data, "trainer.learning_rate=1e-3")
    cli.apply_override(data, "model.name=smollm2-135m")
    assert data == {"env": [{"id": "kuhn_poker", "args": {"legal_choices": True}}],
                    "trainer": {"learning_rate": 1e-3}, "model": {"name": "smollm2-135m"}}
    with pytest.raises(SystemExit, match="env.3 is not an entry of a list of 1"):
        cli.apply_override(data, "env.3.group_size=2")
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        cli.apply_override(data, "trainer.max_steps")
    config = tmp_path / "x.toml"
    config.write_text('[[env]]\nid = "kuhn_poker"\n[trainer]\nmax_steps = 1\n')
    with pytest.raises(ValueError, match="'max_step' is not a field"):
        cli.load_experiment(str(config), ["trainer.max_step=2"])


class UnevaluatedKuhn(KuhnPokerEnv):
    """A user's env outside the library, with no evaluation.py beside it."""


def test_python_m_runs_the_command_and_eval_reads_a_saved_policy(tmp_path):
    config = tmp_path / "kuhn.toml"
    config.write_text('[model]\nname = "tiny"\n[[env]]\nid = "kuhn_poker"\ngroup_size = 2\nargs = { legal_choices = true }\n'
                      f'[trainer]\nmax_steps = 1\ngroups_per_step = 2\nreport_to = []\noutput_dir = "{tmp_path / "run"}"\n')
    done = subprocess.run([sys.executable, "-m", "multiagent_rl", "train", str(config)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = cli.main(["eval", "kuhn_poker", "--model", str(tmp_path / "run" / "final_model")])
    assert 0 <= report["exploitability"] <= 1 and abs(report["invalid_mass"]) < 1e-6
    with pytest.raises(SystemExit, match="ships no evaluation"):
        cli.main(["eval", f"{__name__}:UnevaluatedKuhn", "--model", "tiny"])
