"""Model and dataset cards: the real base model and its license, the envs, their seats and algorithms, reward
statistics, the schema as a Markdown table."""

import json
import logging

from conftest import user_sim_traces

from multiagent_rl.config import ExperimentConfig
from multiagent_rl.data.hub import (
    base_model_id,
    base_model_license,
    TRAINED_ON,
    fix_adapter_base,
    model_card_text,
    trace_dataset_card,
)


def test_the_model_card_names_the_hub_base_model_envs_seats_algorithms_results_and_command(caplog, monkeypatch):
    from multiagent_rl.data import hub

    monkeypatch.setattr(hub, "_UNLICENSED", set())  # warned once per model and process: not yet here
    experiment = ExperimentConfig.model_validate({
        "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"}, "algo": {"type": "rae"},
        "env": [{"id": "kuhn_poker", "roles": {"player_1": {"model": "scripted",
                                                            "policy": "multiagent_rl.envs.kuhn_poker:random_policy"}}},
                {"id": "user_sim"}]})
    with caplog.at_level(logging.WARNING):
        card = model_card_text(experiment, hub_model_id="me/kuhn", results="| exploitability | 0.087 |",
                               command="python recipes/kuhn_poker.py --seed 1", datasets=["me/kuhn-traces"])
    assert "base_model: Qwen/Qwen2.5-0.5B-Instruct" in card and "fine-tuned version of [Qwen/Qwen2.5-0.5B-Instruct]" in card
    assert "[None]" not in card
    assert "| kuhn_poker | player_1 | scripted | frozen |" in card and "| kuhn_poker | player_0 | policy | rae |" in card
    assert "other seats" not in card
    assert "| user_sim | user | scripted | frozen |" in card and "| user_sim | assistant | policy | rae |" in card
    assert "0.087" in card and "python recipes/kuhn_poker.py --seed 1" in card
    assert "pipeline_tag: text-generation" in card and "datasets:\n- me/kuhn-traces" in card
    # offline, the Qwen card is not at hand: no license rather than a wrong one, and a warning that says so
    assert "license:" not in card and "license" in card.split("---", 2)[2].lower()
    assert any("license" in r.getMessage() and "model_card_license" in r.getMessage() for r in caplog.records)
    tiny = model_card_text(ExperimentConfig.model_validate({"env": [{"id": "kuhn_poker"}]}), hub_model_id=None)
    assert "base_model" not in tiny and "embedded tiny model" in tiny and "license: apache-2.0" in tiny
    assert base_model_id("tiny") is None and base_model_id("/models/x") is None and base_model_id("org/m") == "org/m"
    assert base_model_id("smollm2-135m") == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_the_license_comes_from_the_base_model():
    smol = ExperimentConfig.model_validate({"model": {"name": "smollm2-135m"}, "env": [{"id": "kuhn_poker"}]})
    assert "license: apache-2.0" in model_card_text(smol, hub_model_id="me/smol")
    assert base_model_license("smollm2-135m") == "apache-2.0" and base_model_license("tiny") == "apache-2.0"
    assert base_model_license("nobody/unknown-model") is None


def test_a_local_base_folder_gives_its_license(tmp_path):
    (tmp_path / "README.md").write_text("---\nlicense: llama3.2\nbase_model: meta-llama/Llama-3.2-1B\n---\n# x\n")
    assert base_model_license(str(tmp_path)) == "llama3.2"
    (tmp_path / "README.md").unlink()
    (tmp_path / "ready.json").write_text(json.dumps({"base_model": "HuggingFaceTB/SmolLM2-135M-Instruct"}))
    assert base_model_license(str(tmp_path)) == "apache-2.0"


def test_a_lora_adapter_points_at_its_base_by_hub_id(tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/root/.cache/x/snap",
                                                              "r": 8}))
    fix_adapter_base(tmp_path, "Qwen/Qwen2.5-0.5B-Instruct")
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config == {"base_model_name_or_path": "Qwen/Qwen2.5-0.5B-Instruct", "r": 8}
    assert not (tmp_path / TRAINED_ON).exists()  # trained on the Hub id itself: nothing more to say
    fix_adapter_base(tmp_path, "HuggingFaceTB/SmolLM2-135M-Instruct", trained_on="smollm2-135m")
    assert json.loads((tmp_path / TRAINED_ON).read_text()) == {"model": "smollm2-135m"}  # reloads offline on it


def test_the_dataset_card_has_reward_statistics_the_schema_and_how_it_was_made():
    ds = user_sim_traces(per_policy=5)
    card = trace_dataset_card(ds, "me/user-sim-traces", produced_by="python recipes/user_sim.py", filters={"role": "x"})
    assert "| user_sim | assistant | 10 |" in card and "python recipes/user_sim.py" in card
    assert "token_kinds" in card and "load_dataset(\"me/user-sim-traces\"" in card and '{"role": "x"}' in card


def test_the_dataset_card_is_hub_markdown_with_the_hub_metadata():
    from huggingface_hub import DatasetCardData

    ds = user_sim_traces(per_policy=2)
    written = DatasetCardData(dataset_info={"features": [{"name": "run", "dtype": "string"}]},
                              configs=[{"config_name": "default", "data_files": [{"split": "train",
                                                                                  "path": "data/train-*"}]}])
    card = trace_dataset_card(ds, "me/user-sim-traces", card_data=written)
    meta, body = card.split("---", 2)[1:]
    assert "dataset_info:" in meta and "config_name: default" in meta  # what datasets wrote is kept
    assert "pretty_name:" in meta and "- reinforcement-learning" in meta and "- text-generation" in meta
    assert "size_categories:\n- n<1K" in meta and "task_categories:" in meta
    assert "| column | meaning |" in body and "| token_kinds |" in body
    schema = body.split("## Schema", 1)[1]
    assert "====" not in body and "][multiagent_rl" not in body and "``" not in schema and "`kuhn_poker`" in schema
