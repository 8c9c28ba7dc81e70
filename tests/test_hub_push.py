"""Pushing traces and models to the Hub, against the loopback fake (``_local_hub.py``): a real push needs HF_TOKEN."""

import sys
from pathlib import Path

import pytest
import yaml
from _local_hub import FAKE_USER, LocalHub, hub_env
from conftest import user_sim_traces

from multiagent_rl.data.hub import model_card_text, push_traces
from multiagent_rl.data.traces import dataset_to_episodes, filter_traces, load_traces
from multiagent_rl.episodes.records import episode_record


@pytest.fixture
def hub(tmp_path):
    with LocalHub() as served, hub_env(served.url, tmp_path / "hf"):
        yield served


def front_matter(card: str) -> dict:
    return yaml.safe_load(card.split("---", 2)[1])


def test_push_traces_with_filters_and_a_card_then_load_them_back_exactly(hub):
    import datasets
    from huggingface_hub import HfApi

    ds = user_sim_traces()
    url = push_traces(ds, f"{FAKE_USER}/user-sim-best", role="assistant", min_reward=1.0,
                      produced_by="python recipes/user_sim.py --seed 0")
    assert url.endswith(f"/datasets/{FAKE_USER}/user-sim-best") and HfApi().dataset_info(f"{FAKE_USER}/user-sim-best").private
    back = datasets.load_dataset(f"{FAKE_USER}/user-sim-best", split="train")
    expected = filter_traces(ds, role="assistant", min_reward=1.0)
    assert len(back) == len(expected) > 0 and set(back["reward"]) == {1.0}
    assert [episode_record(ep) for _, ep in dataset_to_episodes(back)] == [episode_record(ep) for _, ep in dataset_to_episodes(expected)]
    card = hub.files(f"{FAKE_USER}/user-sim-best", "dataset")["README.md"].decode()
    assert "| user_sim | assistant |" in card and "--seed 0" in card and '"min_reward": 1.0' in card
    with pytest.raises(ValueError, match="no trace matches"):
        push_traces(ds, f"{FAKE_USER}/none", min_reward=5.0)
    assert hub.unhandled == []


def test_the_dataset_card_keeps_what_datasets_wrote_and_adds_the_hub_metadata(hub):
    import datasets

    repo, ds = f"{FAKE_USER}/user-sim-all", user_sim_traces(per_policy=3)
    push_traces(ds, repo)
    card = hub.files(repo, "dataset")["README.md"].decode()
    meta = front_matter(card)
    assert meta["dataset_info"]["features"] and meta["configs"][0]["config_name"] == "default"  # datasets' own
    assert meta["pretty_name"] and meta["size_categories"] == ["n<1K"]
    assert {"reinforcement-learning", "text-generation"} <= set(meta["task_categories"])
    assert "| column | meaning |" in card and "][multiagent_rl" not in card and "====" not in card
    assert len(datasets.load_dataset(repo, split="train")) == len(ds)  # the configs still point at the data
    assert hub.unhandled == []


def test_the_trainer_pushes_the_model_privately_with_its_card(hub, tmp_path):
    import torch
    from huggingface_hub import HfApi
    from transformers import AutoModelForCausalLM

    from multiagent_rl.training.trainer import MixedAlgorithmTrainer

    repo = f"{FAKE_USER}/kuhn-tiny"
    trainer = MixedAlgorithmTrainer({
        "algo": {"type": "rae"}, "env": [{"id": "kuhn_poker", "group_size": 2}],
        "trainer": {"max_steps": 1, "output_dir": str(tmp_path / "run"), "report_to": [], "save_strategy": "no",
                    "hub_model_id": repo}})
    trainer.train()
    trainer.model_card_results = "| exploitability | 0.42 |"
    trainer.model_card_datasets = [f"{repo}-traces"]
    trainer.command = "python my_script.py --fast"
    trainer.save_model(str(tmp_path / "run" / "final_model"))
    final_card = (tmp_path / "run" / "final_model" / "README.md").read_text()
    assert "| kuhn_poker | player_1 | policy | rae |" in final_card and "python my_script.py --fast" in final_card
    trainer.push_to_hub()
    assert HfApi().model_info(repo).private  # private by default, as the traces are
    files = hub.files(repo)
    card = files["README.md"].decode()
    assert "embedded tiny model" in card and "[None]" not in card and "| kuhn_poker | player_0 | policy | rae |" in card
    assert "0.42" in card and front_matter(card)["datasets"] == [f"{repo}-traces"]
    assert front_matter(card)["pipeline_tag"] == "text-generation" and front_matter(card)["license"] == "apache-2.0"
    assert not any(p.startswith(("final_model/", "traces/")) for p in files)  # the root holds the same weights
    back = AutoModelForCausalLM.from_pretrained(repo)
    mine = trainer.accelerator.unwrap_model(trainer.model).state_dict()
    assert all(torch.equal(v, mine[k]) for k, v in back.state_dict().items())
    assert hub.unhandled == []


def test_the_license_is_read_from_the_base_models_card(hub):
    from huggingface_hub import HfApi

    from multiagent_rl.config import ExperimentConfig

    HfApi().create_repo("meta-llama/Llama-3.2-1B-Instruct")
    HfApi().upload_file(path_or_fileobj=b"---\nlicense: llama3.2\n---\n# Llama\n", path_in_repo="README.md",
                        repo_id="meta-llama/Llama-3.2-1B-Instruct")
    experiment = ExperimentConfig.model_validate({"model": {"name": "meta-llama/Llama-3.2-1B-Instruct"},
                                                  "env": [{"id": "kuhn_poker"}]})
    card = model_card_text(experiment, hub_model_id="me/llama-kuhn")
    assert front_matter(card)["license"] == "llama3.2"


def test_a_recipe_pushes_its_model_and_its_traces(hub, tmp_path):
    import datasets
    from huggingface_hub import HfApi

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "recipes"))
    import user_sim

    repo, out = f"{FAKE_USER}/user-sim-run", tmp_path / "run"
    user_sim.main(["--steps", "2", "--warmup-steps", "1", "--group-size", "2", "--groups-per-step", "1",
                   "--eval-every", "100", "--per-persona", "1", "--output-dir", str(out), "--push-to-hub", repo])
    api = HfApi()
    assert api.model_info(repo).private and api.dataset_info(f"{repo}-traces").private
    card = hub.files(repo)["README.md"].decode()
    assert front_matter(card)["datasets"] == [f"{repo}-traces"]
    assert "python recipes/user_sim.py --steps 2" in card and f"--push-to-hub {repo}" in card
    assert "| user_sim_warmup | assistant | scripted | sft |" in card and "| user_sim | assistant | policy | grpo |" in card
    assert (out / "final_model" / "README.md").read_text() == (out / "README.md").read_text()
    pushed = datasets.load_dataset(f"{repo}-traces", split="train")
    assert len(pushed) == len(load_traces(out / "traces")) > 0
    assert hub.unhandled == []


@pytest.mark.parametrize("kind", ["adapters", "full_models"])
def test_each_of_several_policies_pushes_to_its_own_repository(hub, tmp_path, kind):
    from huggingface_hub import HfApi

    from multiagent_rl.training.run import publish
    from multiagent_rl.training.trainer import MixedAlgorithmTrainer

    lora = {"r": 4, "target_modules": "all-linear"}
    policy = {"lora": lora} if kind == "adapters" else {"model": "tiny"}
    trainer = MixedAlgorithmTrainer({
        "model": {"name": "tiny"}, "policies": {"alice": policy, "bob": policy},
        "env": [{"id": "kuhn_poker", "group_size": 2, "args": {"legal_choices": True},
                 "roles": {"player_0": {"policy": "alice"}, "player_1": {"policy": "bob"}}}],
        "trainer": {"max_steps": 1, "output_dir": str(tmp_path / "run"), "report_to": [], "save_strategy": "no"}})
    trainer.train()
    urls = publish(trainer, f"{FAKE_USER}/duo")
    assert set(urls) == {"traces", "model alice", "model bob"}
    weights = ({"adapter_model.safetensors", "adapter_config.json"} if kind == "adapters"
               else {"model.safetensors", "config.json"})
    for name in ("alice", "bob"):
        repo = f"{FAKE_USER}/duo-{name}"
        assert HfApi().model_info(repo).private
        files = hub.files(repo)
        assert weights | {"README.md", "tokenizer_config.json"} <= set(files)
        card = files["README.md"].decode()
        assert f"It is the policy `{name}`" in card and front_matter(card)["datasets"] == [f"{FAKE_USER}/duo-traces"]
        assert front_matter(card)["library_name"] == ("peft" if kind == "adapters" else "transformers")
    assert hub.unhandled == []
