"""Model and dataset cards: the real base model, the envs, roles and algorithms, reward statistics."""

import json

from conftest import user_sim_traces

from multiagent_rl.config import ExperimentConfig
from multiagent_rl.data.hub import base_model_id, fix_adapter_base, model_card_text, trace_dataset_card


def test_the_model_card_names_the_hub_base_model_envs_roles_algorithms_results_and_command():
    experiment = ExperimentConfig.model_validate({
        "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"}, "algo": {"type": "rae"},
        "env": [{"id": "kuhn_poker", "roles": {"player_1": {"model": "scripted",
                                                            "policy": "multiagent_rl.envs.kuhn_poker:random_policy"}}},
                {"id": "user_sim"}]})
    card = model_card_text(experiment, hub_model_id="me/kuhn", results="| exploitability | 0.087 |",
                           command="python recipes/kuhn_poker.py --seed 1")
    assert "base_model: Qwen/Qwen2.5-0.5B-Instruct" in card and "fine-tuned version of [Qwen/Qwen2.5-0.5B-Instruct]" in card
    assert "[None]" not in card
    assert "| kuhn_poker | player_1 | scripted | frozen |" in card and "| kuhn_poker | other seats | policy | rae |" in card
    assert "| user_sim | user | scripted | frozen |" in card
    assert "0.087" in card and "python recipes/kuhn_poker.py --seed 1" in card
    tiny = model_card_text(ExperimentConfig.model_validate({"env": [{"id": "kuhn_poker"}]}), hub_model_id=None)
    assert "base_model" not in tiny and "embedded tiny model" in tiny
    assert base_model_id("tiny") is None and base_model_id("/models/x") is None and base_model_id("org/m") == "org/m"
    assert base_model_id("smollm2-135m") == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_a_lora_adapter_points_at_its_base_by_hub_id(tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/root/.cache/x/snap",
                                                              "r": 8}))
    fix_adapter_base(tmp_path, "Qwen/Qwen2.5-0.5B-Instruct")
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config == {"base_model_name_or_path": "Qwen/Qwen2.5-0.5B-Instruct", "r": 8}


def test_the_dataset_card_has_reward_statistics_the_schema_and_how_it_was_made():
    ds = user_sim_traces(per_policy=5)
    card = trace_dataset_card(ds, "me/user-sim-traces", produced_by="python recipes/user_sim.py", filters={"role": "x"})
    assert "| user_sim | assistant | 10 |" in card and "python recipes/user_sim.py" in card
    assert "token_kinds" in card and "load_dataset(\"me/user-sim-traces\"" in card and '{"role": "x"}' in card
