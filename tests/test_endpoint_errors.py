"""A served model that cannot answer says which endpoint, which URL, what went wrong and what to do.

No vLLM needed: a closed port (a socket bound, then closed) stands for a server that is down or a wrong port, a
loopback ``http.server`` for a server that answers 404 (a ``base_url`` without ``/v1``) or lists its models.
"""

from __future__ import annotations

import http.server
import json
import random
import socket
import threading

import pytest

import multiagent_rl as mrl
from multiagent_rl.backends import EndpointBackend, EndpointConfig, EndpointError, SamplingParams, build_policy_backend
from multiagent_rl.config import ExperimentConfig, ModelConfig
from multiagent_rl.envs.base import play_episodes, run_sync
from multiagent_rl.envs.kuhn_poker import KuhnPokerEnv, random_policy
from multiagent_rl.rollout.health import RunHealth, RunStopped


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeServer:
    """A loopback HTTP server: ``GET {prefix}/models`` lists ``models``; everything else answers 404."""

    def __init__(self, models: list[dict] | None = None, prefix: str = "/v1"):
        served = {"object": "list", "data": [{"object": "model", "created": 0, "owned_by": "test", **m}
                                             for m in models or []]}

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                found = models is not None and self.path == f"{prefix}/models"
                body = json.dumps(served if found else {"detail": "Not Found"}).encode()
                self.send_response(200 if found else 404)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.root = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def not_found():
    server = FakeServer()
    yield server
    server.close()


def kuhn_with_opponent(url: str) -> ExperimentConfig:
    return ExperimentConfig.model_validate({
        "model": {"name": "tiny"},
        "endpoints": {"opp": {"base_url": url, "model": "served-tiny", "tokenizer": "tiny", "max_retries": 0}},
        "env": [{"id": "kuhn_poker", "args": {"legal_choices": True},
                 "roles": {"player_1": {"model": "endpoint:opp"}}}]})


def play_against(experiment: ExperimentConfig, n: int = 2):
    seats = {"player_0": mrl.make_agent(mrl.AgentConfig(model="scripted", policy=random_policy())),
             "player_1": mrl.make_agent(mrl.AgentConfig(model="endpoint:opp"), endpoints=experiment.endpoints)}
    env = KuhnPokerEnv(legal_choices=True)
    return run_sync(play_episodes(env, env.sample_tasks(n, random.Random(0)), seats, seed="0"))


def test_a_frozen_seat_whose_server_is_down_names_the_endpoint_url_and_fix():
    url = f"http://127.0.0.1:{closed_port()}/v1"
    episodes = play_against(kuhn_with_opponent(url))
    assert all(not ep.ok for ep in episodes)
    first = episodes[0].errors[0].splitlines()[0]  # the line a stopped run's summary quotes
    assert first.startswith("env 'kuhn_poker': EndpointError: seat 'player_1': endpoint 'opp' ([endpoints.opp]"), first
    assert f"nothing answers at {url}/models (connection refused, 1 try)" in first, first
    assert "Is the server up? Start it with: python -m vllm.entrypoints.openai.api_server --model served-tiny" in first
    port = url.split(":")[2].split("/")[0]
    assert f"--port {port}" in first and "or correct the port in [endpoints.opp] base_url" in first
    with pytest.raises(RunStopped) as stopped:
        RunHealth(failed_steps=1).after_rollout(episodes, {})
    assert "EndpointError: seat 'player_1': endpoint 'opp'" in str(stopped.value)
    assert f"nothing answers at {url}" in str(stopped.value)
    assert "APIConnectionError" not in str(stopped.value)


def test_a_base_url_without_v1_says_add_v1(not_found):
    backend = EndpointBackend(EndpointConfig(base_url=not_found.root, model="served-tiny", tokenizer="tiny",
                                             max_retries=0), model_id="endpoint:opp")
    with pytest.raises(EndpointError) as error:
        mrl.run_sync(backend.generate([1, 2, 3], SamplingParams(max_new_tokens=2)))
    message = str(error.value)
    assert "\n" not in message
    assert f"{not_found.root}/models answered 404 (Not Found)" in message, message
    assert f"add /v1 to [endpoints.opp] base_url ({not_found.root}/v1)" in message, message
    # the same through an episode: the recorded error's first line says it
    episodes = play_against(kuhn_with_opponent(not_found.root), n=1)
    assert "add /v1 to [endpoints.opp] base_url" in episodes[0].errors[0].splitlines()[0]
    # with /v1, a server without /v1/models is not the OpenAI-compatible API root
    episodes = play_against(kuhn_with_opponent(f"{not_found.root}/v1"), n=1)
    assert (f"{not_found.root}/v1/models answered 404 (Not Found); is [endpoints.opp] base_url the API root of an "
            "OpenAI-compatible server") in episodes[0].errors[0].splitlines()[0]


def test_an_inline_reference_with_max_context_set_reports_the_failed_request(not_found):
    """With ``max_context`` given nothing is asked first: the completion request itself fails, explained."""
    backend = EndpointBackend(EndpointConfig(base_url=not_found.root, model="m", tokenizer="tiny", max_retries=0,
                                             max_context=64))
    with pytest.raises(EndpointError, match=r"served model 'vllm:http://127\.0\.0\.1:\d+#m': http://127\.0\.0\.1:\d+"
                                            r"/completions answered 404 \(Not Found\); base_url must be the API root.*"
                                            r"add /v1 to the base_url in the model reference"):
        mrl.run_sync(backend.generate([1, 2, 3], SamplingParams(max_new_tokens=2)))


def test_the_policy_server_is_checked_when_its_backend_is_built(tiny):
    model, tok = tiny
    url = f"http://127.0.0.1:{closed_port()}/v1"
    config = ModelConfig(name="tiny", backend="vllm", vllm={"mode": "server", "base_url": url, "served_model": "pol"})
    with pytest.raises(EndpointError) as error:
        build_policy_backend(config, model, tok)
    message = str(error.value)
    assert message.startswith(f"the policy's vLLM server ([model.vllm]): nothing answers at {url}/models"), message
    assert "Start it with: VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server --model pol" in message
    assert "--worker-extension-cls multiagent_rl.backends.vllm_sync.WeightSyncExtension" in message
    assert error.value.__suppress_context__  # no pages of httpx frames under it


def test_pushing_weights_to_a_server_that_went_away_says_so(tiny):
    model, tok = tiny
    url = f"http://127.0.0.1:{closed_port()}/v1"
    backend = EndpointBackend(EndpointConfig(base_url=url, model="pol", max_context=512), tokenizer=tok,
                              model_id="policy")
    refused = (r"the policy's vLLM server \(\[model\.vllm\]\): nothing answers at "
               r"http://127\.0\.0\.1:\d+/collective_rpc \(connection refused")
    with pytest.raises(EndpointError, match=refused):
        backend.push_weights(model)
    backend.sync_weights(model)  # deferred: nothing is sent until the policy is next asked for a sample
    assert backend.num_weight_pushes == 0
    with pytest.raises(EndpointError, match=refused):
        mrl.run_sync(backend.generate([1, 2, 3], SamplingParams(max_new_tokens=2)))
    with pytest.raises(EndpointError, match=refused):  # still pending: never a sample with the old weights
        mrl.run_sync(backend.generate([1, 2, 3], SamplingParams(max_new_tokens=2)))
    assert backend.num_weight_pushes == 0


def test_the_context_length_and_the_model_name_are_asked_from_the_server(tiny):
    model, tok = tiny
    server = FakeServer(models=[{"id": "pol", "max_model_len": 96}, {"id": "other", "max_model_len": 4096}])
    try:
        frozen = EndpointBackend(EndpointConfig(base_url=f"{server.root}/v1", model="other", tokenizer="tiny",
                                                max_retries=0))
        assert frozen.max_context is None
        with pytest.raises(EndpointError):  # asked first (4096), then the completion is refused by this fake server
            run_sync(frozen.generate([1, 2, 3], SamplingParams(max_new_tokens=2)))
        assert frozen.max_context == 4096
        config = ModelConfig(name="tiny", backend="vllm", vllm={"mode": "server", "base_url": f"{server.root}/v1",
                                                                 "served_model": "pol"})
        policy = build_policy_backend(config, model, tok)
        assert policy.max_context == 96  # the server's, not [model.vllm] max_model_len's default 2048
        with pytest.raises(ValueError, match="exceeds the context of model 'policy' \\(96 positions\\)"):
            run_sync(policy.generate(list(range(90)), SamplingParams(max_new_tokens=8)))
        wrong = ModelConfig(name="tiny", backend="vllm", vllm={"mode": "server", "base_url": f"{server.root}/v1"})
        with pytest.raises(EndpointError, match=r"serves \['pol', 'other'\], not '.*'; set \[model\.vllm\] "
                                                r"served_model to one of those"):
            build_policy_backend(wrong, model, tok)
    finally:
        server.close()
