"""Pushing traces and models to the Hub, against the loopback fake (``_local_hub.py``): a real push needs HF_TOKEN."""


import pytest
from _local_hub import FAKE_USER, LocalHub, hub_env
from conftest import user_sim_traces

from multiagent_rl.data.hub import push_traces
from multiagent_rl.data.traces import dataset_to_episodes, filter_traces
from multiagent_rl.episodes.records import episode_record


@pytest.fixture
def hub(tmp_path):
    with LocalHub() as served, hub_env(served.url, tmp_path / "hf"):
        yield served


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


def test_the_trainer_pushes_the_model_with_its_card(hub, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from multiagent_rl.training.trainer import MixedAlgorithmTrainer

    repo = f"{FAKE_USER}/kuhn-tiny"
    trainer = MixedAlgorithmTrainer({
        "algo": {"type": "rae"}, "env": [{"id": "kuhn_poker", "group_size": 2}],
        "trainer": {"max_steps": 1, "output_dir": str(tmp_path / "run"), "report_to": [], "save_strategy": "no",
                    "hub_model_id": repo, "hub_private_repo": True}})
    trainer.train()
    trainer.model_card_results = "| exploitability | 0.42 |"
    trainer.push_to_hub()
    files = hub.files(repo)
    card = files["README.md"].decode()
    assert "embedded tiny model" in card and "[None]" not in card and "| kuhn_poker | other seats | policy | rae |" in card
    assert "0.42" in card
    back = AutoModelForCausalLM.from_pretrained(repo)
    mine = trainer.accelerator.unwrap_model(trainer.model).state_dict()
    assert all(torch.equal(v, mine[k]) for k, v in back.state_dict().items())
    assert hub.unhandled == []
