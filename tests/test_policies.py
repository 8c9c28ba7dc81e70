"""Several policies in one run (LoRA adapters on one base) and opponent pools of past snapshots.

Oracles: the single-policy trainer (TRL's own PEFT path) on each policy's traces alone — two policies' loss and
gradients are the sum of those two runs'; an adapter's gradient from another policy's rows is exactly zero; a resumed
run ends with the weights and optimizer state of an uninterrupted one; pool draws follow their rule's weights.
"""

from __future__ import annotations

import copy
import json
import random

import pydantic
import pytest
import torch
from peft import set_peft_model_state_dict

from multiagent_rl.config import ExperimentConfig, PolicyConfig, PoolSamplingConfig
from multiagent_rl.data.traces import load_traces
from multiagent_rl.models import load_model_and_tokenizer
from multiagent_rl.models.adapters import adapter_state, use_adapter
from multiagent_rl.rollout.pools import OpponentPool, Snapshot
from multiagent_rl.training import loss as loss_module
from multiagent_rl.training.collate import collate, trainable_samples
from multiagent_rl.training.trainer import MixedAlgorithmTrainer

from conftest import feed, loss_and_grads, mixed_args

LORA = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear", "init_lora_weights": False}


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def two_policies(**policy_b) -> dict:
    return {"model": {"name": "tiny"}, "algo": {"type": "grpo"},
            "policies": {"alice": {"lora": LORA}, "bob": {"lora": LORA, **policy_b}},
            "env": [{"id": "kuhn_poker", "group_size": 4, "args": {"legal_choices": True},
                     "roles": {"player_0": {"policy": "alice"}, "player_1": {"policy": "bob"}}}]}


def trainer_for(experiment, tiny, tmp_path, **kw) -> MixedAlgorithmTrainer:
    model, tok = tiny
    return MixedAlgorithmTrainer(experiment, args=mixed_args(tmp_path, groups_per_step=2, **kw),
                                 model=copy.deepcopy(model), processing_class=tok)


def batch_of(trainer, samples, num_policies: int) -> dict:
    batch = collate(samples, trainer.tokenizer.pad_token_id, temperature=trainer.temperature)
    trainer.index_policies(batch)
    return loss_module.add_global_counts(batch, lambda t: t, num_policies=num_policies)


# -- config ---------------------------------------------------------------------------------------


def test_policies_bind_by_name_and_bad_bindings_say_the_fix():
    experiment = ExperimentConfig.model_validate(two_policies())
    env = experiment.env[0]
    assert experiment.policy_names() == ["alice", "bob"] and experiment.uses_adapters
    assert [experiment.policy_of_seat(env, r) for r in ("player_0", "player_1")] == ["alice", "bob"]
    one = ExperimentConfig.model_validate({"model": {"name": "tiny"}, "env": [{"id": "kuhn_poker"}]})
    assert one.policy_names() == ["policy"] and not one.uses_adapters  # no new keys: today's single policy

    def refused(config, match):
        with pytest.raises(pydantic.ValidationError, match=match):
            ExperimentConfig.model_validate(config)

    unbound = two_policies()
    del unbound["env"][0]["roles"]["player_1"]["policy"]
    refused(unbound, r"role 'player_1' plays a policy but \[policies\] defines \['alice', 'bob'\]: name one with")
    typo = two_policies()
    typo["env"][0]["roles"]["player_1"]["policy"] = "carol"
    refused(typo, r"policy = 'carol' is not in \[policies\]")
    no_lora = two_policies()
    del no_lora["policies"]["bob"]["lora"]
    refused(no_lora, r"\[policies.bob\]: several policies train as LoRA adapters on one base model; set")
    served = two_policies()
    served["model"]["backend"] = "vllm"
    for vllm in ({"mode": "colocate"}, {"mode": "server", "base_url": "http://127.0.0.1:8000/v1"}):
        ExperimentConfig.model_validate({**served, "model": {**served["model"], "vllm": vllm}})  # adapters on vLLM
    pool = {"model": {"name": "tiny"}, "env": [{"id": "kuhn_poker", "roles": {"player_1": {"model": "pool:policy"}}}]}
    refused(pool, r"policy 'policy' takes no snapshots: set \[policies.policy\] snapshot_every = N")
    refused({**pool, "policies": {"policy": {"snapshot_every": 2}},
             "env": [{"id": "kuhn_poker", "roles": {"player_1": {"model": "pool:policy", "trainable": True}}}]},
            "a pool seat plays past snapshots and is never trained")


def test_an_imitation_seat_names_its_learner_and_its_rows_go_to_it():
    from multiagent_rl.training.policies import PoliciesMixin

    config = two_policies()
    teacher = {"model": "scripted", "policy": "multiagent_rl.envs.kuhn_poker:random_policy", "algo": {"type": "sft"}}
    config["env"].insert(0, {"id": "kuhn_poker", "name": "warmup", "roles": {"player_0": teacher,
                                                                          "player_1": {**teacher, "learner": "bob"}}})
    with pytest.raises(pydantic.ValidationError, match=r"role 'player_0': a trainable seat played by 'scripted' "
                                                       r"\(imitation\) with several \[policies\]: say which one"):
        ExperimentConfig.model_validate(config)
    config["env"][0]["roles"]["player_0"]["learner"] = "alice"
    experiment = ExperimentConfig.model_validate(config)

    class Routing(PoliciesMixin):
        def __init__(self):
            self.experiment = experiment

    batch = {"policy": [None, None, "bob", "alice", None], "env": ["warmup", "warmup", "kuhn_poker", "kuhn_poker", ""],
             "role": ["player_0", "player_1", "player_1", "player_0", ""], "completion_ids": torch.zeros(5, 1)}
    Routing().index_policies(batch)
    assert batch["policy_index"].tolist() == [0, 1, 1, 0, 0]  # the last is a padding row


# -- training several policies --------------------------------------------------------------------


def test_two_policies_train_only_on_their_own_traces_and_sum_to_two_single_policy_runs(tmp_path, tiny):
    trainer = trainer_for(two_policies(), tiny, tmp_path / "two")
    batch = trainer._generate_and_score_completions(None)
    samples = trainable_samples(trainer.rollout_step.local)
    by_policy = {name: [s for s in samples if s.trace.policy == name] for name in ("alice", "bob")}
    assert all(by_policy.values()) and len(samples) == sum(map(len, by_policy.values()))
    assert {s.trace.role for s in by_policy["alice"]} == {"player_0"} and {s.trace.role for s in by_policy["bob"]} == {
        "player_1"}
    loss, grads = loss_and_grads(trainer, batch)

    # a batch of bob's traces only: alice's adapter gets exactly zero gradient, bob's does not
    _, bob_only = loss_and_grads(trainer, batch_of(trainer, by_policy["bob"], 2))
    assert not any(".alice." in n for n, g in bob_only.items() if g.abs().max() > 0)
    assert any(".bob." in n and g.abs().max() > 0 for n, g in bob_only.items())
    assert not any(".base_layer." in n or "lora" not in n for n in grads)  # the base stays frozen

    # the oracle: the single-policy trainer (TRL's PEFT path, adapter "default") with each adapter's weights
    single_config = {"model": {"name": "tiny", "lora": LORA}, "algo": {"type": "grpo"},
                     "env": [{"id": "kuhn_poker", "group_size": 4, "args": {"legal_choices": True}}]}
    total, expected = 0.0, {}
    for name in ("alice", "bob"):
        single = trainer_for(single_config, tiny, tmp_path / name)
        set_peft_model_state_dict(single.model, adapter_state(trainer.model, name), adapter_name="default")
        single_loss, single_grads = loss_and_grads(single, batch_of(single, by_policy[name], 1))
        total += single_loss
        expected.update({n.replace(".default.", f".{name}."): g for n, g in single_grads.items()})
    assert torch.allclose(loss, total, atol=1e-6), (loss, total)
    assert grads.keys() == expected.keys()
    assert max((grads[n] - expected[n]).abs().max().item() for n in grads) < 1e-6


def test_each_policy_has_its_learning_rate_saves_on_its_own_and_resumes_exactly(tmp_path, tiny):
    experiment = two_policies(learning_rate=3e-4)
    run = dict(max_steps=2, save_strategy="steps", save_steps=1, save_episodes=True, learning_rate=1e-3,
               lr_scheduler_type="constant")
    whole = trainer_for(experiment, tiny, tmp_path / "whole", **run)
    whole.train()
    assert [g["lr"] for g in whole.optimizer.param_groups] == [1e-3, 3e-4]
    whole.save_model(str(tmp_path / "final"))
    for name in ("alice", "bob"):
        folder = tmp_path / "final" / name
        assert (folder / "adapter_model.safetensors").exists() and (folder / "tokenizer_config.json").exists()
        card = (folder / "README.md").read_text()
        assert f"It is the policy `{name}`" in card and f"policy `{name}`" in card.split("| algorithm |")[1]
    traces = load_traces(tmp_path / "whole")
    assert {(r["role"], r["policy"]) for r in traces} == {("player_0", "alice"), ("player_1", "bob")}
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    trained = whole.accelerator.unwrap_model(whole.model)
    for name in ("alice", "bob"):  # each saved policy reloads by its folder as the adapter on its base
        reloaded, _ = load_model_and_tokenizer(str(tmp_path / "final" / name), device="cpu")
        with use_adapter(trained, name), torch.no_grad():
            expected = trained(input_ids=ids).logits
        with trained.disable_adapter(), torch.no_grad():
            assert not torch.allclose(trained(input_ids=ids).logits, expected, atol=1e-5)  # the adapter matters
        with torch.no_grad():
            assert torch.allclose(reloaded(input_ids=ids).logits, expected, atol=1e-5), name

    resumed = trainer_for(experiment, tiny, tmp_path / "resumed", **run)
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-1"))
    for name in ("alice", "bob"):
        final, again = adapter_state(whole.model, name), adapter_state(resumed.model, name)
        assert max((final[k] - again[k]).abs().max().item() for k in final) < 1e-6, name
    for group_whole, group_resumed in zip(whole.optimizer.param_groups, resumed.optimizer.param_groups):
        for p, q in zip(group_whole["params"], group_resumed["params"]):
            sw, sr = whole.optimizer.state[p], resumed.optimizer.state[q]
            assert sw["step"] == sr["step"] and torch.allclose(sw["exp_avg"], sr["exp_avg"], atol=1e-7)


# -- full-model policies ----------------------------------------------------------------------------


def full_models(legal_choices: bool = False, **policy_b) -> dict:
    config = two_policies(**policy_b)
    config["policies"] = {"alice": {"model": "tiny"}, "bob": {"model": "tiny", **policy_b}}
    config["env"][0]["args"]["legal_choices"] = legal_choices  # free text: TRL's fused head on each policy's model
    return config


def two_models(tiny) -> dict:
    """Two different models (bob's weights moved), so a mix-up of policies changes the numbers."""
    model, _ = tiny
    bob = copy.deepcopy(model)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in bob.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return {"alice": copy.deepcopy(model), "bob": bob}


def full_trainer_for(experiment, tiny, tmp_path, **kw) -> MixedAlgorithmTrainer:
    return MixedAlgorithmTrainer(experiment, args=mixed_args(tmp_path, groups_per_step=2, **kw),
                                 model=two_models(tiny), processing_class=tiny[1])


def test_full_model_policies_are_refused_where_they_cannot_train_with_the_fix():
    ok = ExperimentConfig.model_validate(full_models())
    assert ok.uses_full_models and not ok.uses_adapters and ok.policy_base("bob") == "tiny"

    def refused(config, match):
        with pytest.raises(pydantic.ValidationError, match=match):
            ExperimentConfig.model_validate(config)

    mixed = full_models()
    del mixed["policies"]["bob"]["model"]
    refused(mixed, r"\['alice'\] name their own full model and \['bob'\] do not: .* give \[policies.bob\] a model")
    both = full_models()
    both["policies"]["bob"]["lora"] = LORA
    refused(both, r"\[policies.bob\]: `model` .* and `lora` .* exclude each other")
    refused({**full_models(), "model": {"name": "tiny", "lora": LORA}}, r"\[model\] lora with full-model \[policies\]")
    refused({**full_models(), "model": {"name": "tiny", "backend": "vllm"}},
            r"vLLM serves several policies as LoRA adapters of one base")
    refused({"policies": {"policy": {"model": "tiny"}}, "env": [{"id": "kuhn_poker"}]},
            r"the only policy is the run's model; set \[model\] name = 'tiny' instead")


def test_the_rollout_engine_loads_each_full_model_policy_on_its_own():
    from multiagent_rl.rollout.engine import Orchestrator

    engine = Orchestrator.from_config(full_models(legal_choices=True))
    alice, bob = engine.policies["alice"], engine.policies["bob"]
    assert alice.model is engine.policy_model["alice"] and bob.model is engine.policy_model["bob"]
    assert alice.model is not bob.model and alice.adapter is None
    episodes = engine.play(0)
    assert {(t.role, t.policy) for ep in episodes for t in ep.traces} == {("player_0", "alice"), ("player_1", "bob")}


def test_several_policies_refuse_fsdp_and_deepspeed_naming_ddp(tmp_path, tiny):
    trainer = trainer_for(two_policies(), tiny, tmp_path)
    trainer.check_policies_supported()  # DDP or one process: fine
    for wrapper in ("is_fsdp_enabled", "is_deepspeed_enabled"):
        setattr(trainer, wrapper, True)
        with pytest.raises(ValueError, match=r"FSDP and DeepSpeed .* do not; launch with DDP"):
            trainer.check_policies_supported()
        setattr(trainer, wrapper, False)


def test_full_model_policies_need_one_tokenizer(tiny):
    from multiagent_rl.models.policy_models import check_same_tokenizer

    _, tok = tiny
    other = copy.deepcopy(tok)
    check_same_tokenizer(tok, other, ("alice", "tiny"), ("bob", "tiny"))
    other.add_tokens(["<extra_token>"])
    with pytest.raises(ValueError, match=r"\[policies.bob\] model = 'other' has another tokenizer than "
                                         r"\[policies.alice\] model = 'tiny'"):
        check_same_tokenizer(tok, other, ("alice", "tiny"), ("bob", "other"))


def test_full_model_policies_train_only_on_their_own_traces_and_sum_to_two_single_model_runs(tmp_path, tiny):
    from _two_policies_check import shares  # hand-built free-text episodes, rewards varying within each group

    trainer = full_trainer_for(full_models(), tiny, tmp_path / "two")
    feed(trainer, lambda step: shares(step, 1)[0])
    batch = trainer._generate_and_score_completions(None)
    samples = trainable_samples(trainer.rollout_step.local)
    by_policy = {name: [s for s in samples if s.trace.policy == name] for name in ("alice", "bob")}
    assert all(by_policy.values()) and len(samples) == sum(map(len, by_policy.values()))
    live = trainer.accelerator.unwrap_model(trainer.model)
    for name, backend in trainer.rollout.policies.items():  # each policy samples from its own model
        assert backend.model is live[name] and backend.adapter is None
    loss, grads = loss_and_grads(trainer, batch)
    assert {n.split(".")[1] for n in grads} == {"alice", "bob"}

    _, bob_only = loss_and_grads(trainer, batch_of(trainer, by_policy["bob"], 2))
    assert not any(n.startswith("policies.alice.") for n, g in bob_only.items() if g.abs().max() > 0)
    assert any(n.startswith("policies.bob.") and g.abs().max() > 0 for n, g in bob_only.items())

    # the oracle: the single-model trainer (TRL's own path) with each policy's weights, on that policy's traces alone
    single_config = {"model": {"name": "tiny"}, "algo": {"type": "grpo"},
                     "env": [{"id": "kuhn_poker", "group_size": 4, "args": {"legal_choices": False}}]}
    total, expected = 0.0, {}
    for name in ("alice", "bob"):
        model, tok = load_model_and_tokenizer("tiny")
        model.load_state_dict(live[name].state_dict())
        single = MixedAlgorithmTrainer(single_config, args=mixed_args(tmp_path / name, groups_per_step=2),
                                       model=model, processing_class=tok)
        single_loss, single_grads = loss_and_grads(single, batch_of(single, by_policy[name], 1))
        total += single_loss
        expected.update({f"policies.{name}.{n}": g for n, g in single_grads.items()})
    assert torch.allclose(loss, total, atol=1e-6), (loss, total)
    assert grads.keys() == expected.keys()
    assert max((grads[n] - expected[n]).abs().max().item() for n in grads) < 1e-6


def test_full_model_policies_have_their_learning_rates_save_on_their_own_and_resume_exactly(tmp_path, tiny):
    experiment = full_models(legal_choices=True, learning_rate=3e-4)
    run = dict(max_steps=2, save_strategy="steps", save_steps=1, save_episodes=True, learning_rate=1e-3,
               lr_scheduler_type="constant", weight_decay=0.1)
    whole = full_trainer_for(experiment, tiny, tmp_path / "whole", **run)
    whole.train()
    groups = [(g["lr"], g["weight_decay"]) for g in whole.optimizer.param_groups]
    assert groups == [(1e-3, 0.1), (1e-3, 0.0), (3e-4, 0.1), (3e-4, 0.0)]  # per policy: with and without decay
    whole.save_model(str(tmp_path / "final"))
    live = whole.accelerator.unwrap_model(whole.model)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    for name in ("alice", "bob"):  # each saved policy reloads by its folder as a model of its own
        folder = tmp_path / "final" / name
        card = (folder / "README.md").read_text()
        assert "its own full model" in card and f"It is the policy `{name}`" in card and "library_name: transformers" in card
        reloaded, _ = load_model_and_tokenizer(str(folder), device="cpu")
        with torch.no_grad():
            assert torch.allclose(reloaded(input_ids=ids).logits, live[name](input_ids=ids).logits, atol=1e-5), name
    with torch.no_grad():
        assert not torch.allclose(live["alice"](input_ids=ids).logits, live["bob"](input_ids=ids).logits, atol=1e-3)
    traces = load_traces(tmp_path / "whole")
    assert {(r["role"], r["policy"]) for r in traces} == {("player_0", "alice"), ("player_1", "bob")}

    resumed = full_trainer_for(experiment, tiny, tmp_path / "resumed", **run)
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-1"))
    final, again = whole.model.state_dict(), resumed.model.state_dict()
    assert final.keys() == again.keys() and max((final[k] - again[k]).abs().max().item() for k in final) < 1e-6
    for group_whole, group_resumed in zip(whole.optimizer.param_groups, resumed.optimizer.param_groups):
        for p, q in zip(group_whole["params"], group_resumed["params"]):
            sw, sr = whole.optimizer.state[p], resumed.optimizer.state[q]
            assert sw["step"] == sr["step"] and torch.allclose(sw["exp_avg"], sr["exp_avg"], atol=1e-7)


def test_a_full_model_policy_snapshots_its_own_model_and_rolls_out_ahead_from_a_copy(tmp_path, tiny):
    pooled = full_models(legal_choices=True, snapshot_every=1)
    pooled["env"][0]["roles"]["player_1"] = {"model": "pool:bob"}  # alice plays bob's past models; bob plays nothing
    trainer = full_trainer_for(pooled, tiny, tmp_path / "pool", max_steps=2)
    trainer.train()
    live = trainer.accelerator.unwrap_model(trainer.model)
    snapshots = trainer.rollout.pools["bob"].snapshots
    assert [s.name for s in snapshots] == ["bob@0", "bob@1"]
    for snapshot in snapshots:  # frozen copies of bob's model (bob never trains here), not alice's
        state = snapshot.backend.model.state_dict()
        assert all(torch.equal(state[k], v) for k, v in live["bob"].state_dict().items())
        assert snapshot.backend.model is not live["bob"] and not any(
            p.requires_grad for p in snapshot.backend.model.parameters())

    ahead = full_trainer_for(full_models(legal_choices=True), tiny, tmp_path / "ahead", max_steps=2, async_rollouts=1)
    live = ahead.accelerator.unwrap_model(ahead.model)
    for name, backend in ahead.rollout.policies.items():  # each policy samples its own model's copy
        assert backend.model is ahead.ahead.copy[name] and backend.model is not live[name]
    ahead.train()
    assert ahead.state.global_step == 2


# -- opponent pools ---------------------------------------------------------------------------------


def pool_experiment(rule: dict | None = None) -> dict:
    seat = {"model": "pool:policy"} | ({"pool": rule} if rule else {})
    return {"model": {"name": "tiny"}, "algo": {"type": "grpo"}, "policies": {"policy": {"snapshot_every": 1}},
            "env": [{"id": "kuhn_poker", "group_size": 4, "args": {"legal_choices": True}, "roles": {"player_1": seat}}]}


def test_a_pool_seat_plays_frozen_snapshots_records_results_and_resumes(tmp_path, tiny):
    run = dict(max_steps=3, save_strategy="steps", save_steps=2, save_episodes=True)
    trainer = trainer_for(pool_experiment({"rule": "pfsp"}), tiny, tmp_path / "pool", **run)
    trainer.train()
    pool = trainer.rollout.pools["policy"]
    assert [s.name for s in pool.snapshots] == ["policy@0", "policy@1", "policy@2"]
    assert sum(s.games for s in pool.snapshots) == 3 * 2 * 4  # every episode's result, against whom it was drawn
    live = dict(trainer.model.named_parameters())
    for snapshot in pool.snapshots:  # frozen copies, never trained, and the first one is the initial weights
        assert not any(p.requires_grad for p in snapshot.backend.model.parameters())
    first = dict(pool.snapshots[0].backend.model.named_parameters())
    assert any(not torch.equal(first[n], live[n]) for n in live)  # the policy moved on; its snapshot did not
    traces = load_traces(tmp_path / "pool")
    opponents = [r for r in traces if r["role"] == "player_1"]
    assert opponents and all(not r["trainable"] and r["model"] == "pool:policy" for r in opponents)
    assert {r["policy"] for r in opponents} <= {"policy@0", "policy@1", "policy@2"}
    assert {r["policy"] for r in traces if r["role"] == "player_0"} == {"policy"}
    logged = [h for h in trainer.state.log_history if any("/opponent/" in k for k in h)]
    assert logged and any(k.endswith("/win_rate") for k in logged[-1])

    resumed = trainer_for(pool_experiment({"rule": "pfsp"}), tiny, tmp_path / "again", **run)
    resumed.train(resume_from_checkpoint=str(tmp_path / "pool" / "checkpoint-2"))
    again = resumed.rollout.pools["policy"]
    assert [(s.name, s.games, s.wins) for s in again.snapshots] == [(s.name, s.games, s.wins) for s in pool.snapshots]
    for a, b in zip(pool.snapshots, again.snapshots):
        sa, sb = a.backend.model.state_dict(), b.backend.model.state_dict()
        assert all(torch.allclose(sa[k], sb[k], atol=1e-6) for k in sa)


def test_pool_rules_draw_by_their_weights(tiny):
    model, tok = tiny
    pool = OpponentPool("policy", PolicyConfig(snapshot_every=1, pool_size=3), model, tok)
    pool.snapshots = [Snapshot(f"policy@{k}", k, None, wins=w, games=10) for k, w in enumerate((0, 5, 9, 10))]
    rng = random.Random(0)

    def shares(rule: PoolSamplingConfig, n: int = 20000) -> list[float]:
        drawn = [pool.draw(rule, rng).step for _ in range(n)]
        return [drawn.count(k) / n for k in range(4)]

    assert shares(PoolSamplingConfig(rule="latest", k=2))[:2] == [0.0, 0.0]
    uniform = shares(PoolSamplingConfig())
    assert all(abs(x - 0.25) < 0.02 for x in uniform)
    weights = [(1 - w / 10) ** 2 for w in (0, 5, 9, 10)]  # PFSP "hard": the snapshots the learner still loses to
    pfsp = shares(PoolSamplingConfig(rule="pfsp"))
    assert all(abs(x - w / sum(weights)) < 0.02 for x, w in zip(pfsp, weights)) and pfsp[3] == 0.0
    pool.take(7)
    pool.take(8)  # pool_size 3: the oldest leave first
    assert [s.step for s in pool.snapshots] == [3, 7, 8]
    assert json.dumps(pool.save.__doc__)  # documented


def test_snapshots_of_a_lora_policy_are_frozen_adapters_on_the_same_base(tmp_path, tiny):
    experiment = pool_experiment({"rule": "latest", "k": 1})
    experiment["policies"]["policy"]["lora"] = LORA
    trainer = trainer_for(experiment, tiny, tmp_path / "lora", max_steps=2, learning_rate=1e-2)
    initial = adapter_state(trainer.model, "policy")
    trainer.train()
    model = trainer.model
    assert set(model.peft_config) == {"policy", "policy_at_0", "policy_at_1"}
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(".policy." in n for n in trained)
    in_optimizer = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    assert in_optimizer == {id(p) for n, p in model.named_parameters() if n in trained}
    first, now = adapter_state(model, "policy_at_0"), adapter_state(model, "policy")
    assert all(torch.equal(first[k], initial[k]) for k in initial)  # the step-0 snapshot kept the initial weights
    assert any(not torch.equal(now[k], initial[k]) for k in initial)  # while the policy learned
    assert model.active_adapter == "policy"


@pytest.mark.parametrize("kind", ["adapters", "full_models"])
def test_two_policies_on_two_processes_match_one_process(tmp_path, kind):
    """torchrun (gloo, 2 CPU processes, DDP) vs 1 process on the same fixed rollout: every policy (adapter or full
    model) ends with the same weights on both ranks and as one process (the per-policy forward passes bypass DDP's
    reducer; the gradients are averaged once per step), and the logged losses agree."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    script = str(Path(__file__).parent / "_two_policies_check.py")
    flags = ["--full-models"] if kind == "full_models" else []
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    two = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                            "127.0.0.1", "--master_port", str(port), script, str(tmp_path / "two"), *flags], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    one = subprocess.run([sys.executable, script, str(tmp_path / "one"), *flags], env=env, capture_output=True,
                         text=True, timeout=300)
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
    output, _ = two.communicate(timeout=300)
    assert two.returncode == 0, output[-4000:]
    single = torch.load(tmp_path / "one" / "rank0.pt")
    ranks = [torch.load(tmp_path / "two" / f"rank{r}.pt") for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2] and ranks[0]["model_class"] == "DistributedDataParallel"
    for name in ("alice", "bob"):
        for rank in ranks:
            for key, value in single["policies"][name].items():
                assert torch.allclose(rank["policies"][name][key], value, atol=1e-5), (name, key)
    assert ranks[0]["losses"] == pytest.approx(single["losses"], abs=1e-5)
