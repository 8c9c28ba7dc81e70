"""Models served elsewhere, behind an OpenAI-compatible HTTP API: frozen seats, judges, simulated users, teachers.

Two kinds of server:

- ``vllm``: a vLLM server (``python -m vllm.entrypoints.openai.api_server``, or ``vllm serve``). Token
  exact: prompts go as token ids to ``/v1/completions`` and the sampled token ids come back with their
  logprobs (start the server with ``--logprobs-mode processed_logprobs`` so they are the logprobs at the
  sampling temperature, as the trainer's); constrained choices through vLLM's ``allowed_token_ids``;
  teacher scoring through ``prompt_logprobs``. Also the policy's server in ``[model] backend = "vllm"``
  server mode, where new weights reach it after every optimizer step ([`vllm_sync`][multiagent_rl.backends.vllm_sync]).
- ``openai``: any chat-completions server (OpenAI, hosted models, ...). Text in, text out: the chat so far
  is sent as messages and the reply is re-tokenised with the local tokenizer, so its trace is marked
  ``token_exact = False`` and a trained seat may not use it.

Reach one from a config by a model reference: ``"vllm:http://127.0.0.1:8000/v1#Qwen/Qwen2.5-7B-Instruct"``,
``"openai:https://api.openai.com/v1#gpt-4o-mini"``, or ``"endpoint:NAME"`` for a named ``[endpoints.NAME]``
table with every option. The API key is read from the environment variable ``api_key_env`` names, when the
backend is built; it is never logged, written to traces or saved in checkpoints (only the variable's name is
in the config). Requests are limited to ``max_concurrency`` in flight; the ``openai`` client retries
429/5xx/timeouts with exponential backoff (``max_retries``) under a per-request ``timeout``.

A server that cannot answer (down, a wrong port, a ``base_url`` without ``/v1``, a model it does not serve, a
timeout) raises an ``EndpointError`` (``multiagent_rl.backends.endpoint_errors``), whose one-line message names the
endpoint and the setting to change, its URL, what went wrong and the likely fix; that line is what an episode's
error and a stopped run's summary quote.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import logging
import math
import os
import shutil
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

from .base import DeferredWeightPush, Generation, SamplingParams, check_context
from .endpoint_errors import EndpointError, describe, explain, server_message, setting

logger = logging.getLogger(__name__)

KINDS = ("vllm", "openai")


class EndpointConfig(BaseModel):
    """An OpenAI-compatible server and how to talk to it."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    kind: Literal["vllm", "openai"] = "vllm"
    """``vllm``: token ids in and out, logprobs, constrained choices, teacher scoring; ``openai``: chat text only."""
    base_url: str
    """The API root, e.g. ``http://127.0.0.1:8000/v1``."""
    model: str
    """The served model's name (what the server calls it)."""
    tokenizer: str | None = None
    """A local copy of the model's tokenizer (``"tiny"``, a Hub id or a path) to build token-level traces;
    default: ``model``."""
    api_key_env: str | None = None
    """Name of the environment variable holding the API key (default: none for ``vllm``, ``OPENAI_API_KEY`` for
    ``openai``). The key itself is never stored."""
    max_concurrency: int = Field(32, ge=1)
    """Most requests in flight at once."""
    timeout: float = Field(120.0, gt=0)
    """Seconds one request may take before it is retried."""
    max_retries: int = Field(3, ge=0)
    """Retries with exponential backoff on 429, 5xx, timeouts and connection errors."""
    max_context: int | None = Field(None, ge=1)
    """The server's context length (prompt + reply). Default: for a ``vllm`` server, asked from it before the first
    request (the ``max_model_len`` its ``/v1/models`` reports); for an ``openai`` one unknown (a request that does
    not fit is refused by the server)."""

    @property
    def reference(self) -> str:
        return f"{self.kind}:{self.base_url}#{self.model}"


def is_endpoint_reference(model: str) -> bool:
    """Whether ``model`` names a served model (``vllm:``, ``openai:`` or ``endpoint:``) rather than a local one."""
    return model.split(":", 1)[0] in (*KINDS, "endpoint")


def parse_reference(model: str, endpoints: dict[str, EndpointConfig] | None = None) -> EndpointConfig:
    """``"vllm:URL#MODEL"``, ``"openai:URL#MODEL"`` or ``"endpoint:NAME"`` → its
    [`EndpointConfig`][multiagent_rl.backends.endpoint.EndpointConfig]."""
    scheme, _, rest = model.partition(":")
    if scheme == "endpoint":
        if not endpoints or rest not in endpoints:
            known = ", ".join(sorted(endpoints or {})) or "none"
            raise ValueError(f"model {model!r} names endpoint {rest!r}, but [endpoints] defines: {known}")
        return endpoints[rest]
    if scheme not in KINDS or "#" not in rest:
        raise ValueError(f"model {model!r}: write a served model as 'vllm:http://host:port/v1#MODEL_NAME' or "
                         "'openai:https://api.example.com/v1#MODEL_NAME' (or 'endpoint:NAME' for an [endpoints] table)")
    base_url, _, name = rest.partition("#")
    return EndpointConfig(kind=scheme, base_url=base_url, model=name)


class EndpointBackend(DeferredWeightPush):
    """A generation backend for a model behind an OpenAI-compatible server (see the module docstring).

    ```pycon
    >>> backend = EndpointBackend(EndpointConfig(base_url="http://127.0.0.1:8000/v1", model="tiny"))  # doctest: +SKIP

    ```
    """

    exact_logprobs = False
    """Another engine's logprobs: a served policy gets the importance-sampling correction."""

    def __init__(self, config: EndpointConfig, tokenizer=None, model_id: str | None = None, *,
                 weight_handoff: Literal["auto", "file", "http"] = "auto", weights_dir: str | None = None):
        from ..models import load_tokenizer

        self.config = config
        self.weight_handoff, self.weights_dir = weight_handoff, weights_dir
        """How a trained policy's weights reach the server (see ``push_weights``)."""
        self.adapter: str | None = None
        """A LoRA policy's PEFT adapter, pushed to a server with LoRA on as an adapter (``vllm_sync.push_adapter_to_server``)."""
        self.served_model = config.model
        """The name requests ask for: the model, or the pushed adapter's name on the server."""
        self.model_id = model_id or config.reference
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config.tokenizer or config.model)
        key_env = config.api_key_env or ("OPENAI_API_KEY" if config.kind == "openai" else None)
        api_key = os.environ.get(key_env) if key_env else None
        if key_env and not api_key:
            raise ValueError(f"endpoint {config.base_url} needs an API key in the environment variable {key_env}, "
                             "which is not set")
        self._client_options = dict(base_url=config.base_url, api_key=api_key or "EMPTY", timeout=config.timeout,
                                    max_retries=config.max_retries)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._loop = None
        self.supports_choices = config.kind == "vllm"
        self.text_only = config.kind == "openai"
        """Chat text in and out (no token ids): the tool harness and trained seats need a token-level backend."""
        self.token_exact = config.kind == "vllm"
        self.max_context = config.max_context
        self._asked = config.kind != "vllm" or config.max_context is not None
        """Whether the server's context length is known or not to be asked for (see ``max_context``)."""
        self.num_requests = 0

    def __repr__(self) -> str:  # the key never appears, the variable's name does
        return f"EndpointBackend({self.config.reference}, api_key_env={self.config.api_key_env!r})"

    def _bind_loop(self) -> None:
        """An HTTP client and a concurrency limit belong to one event loop: make them for the running one."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            from openai import AsyncOpenAI

            self._loop = loop
            self._client = AsyncOpenAI(**self._client_options)
            self._slots = asyncio.Semaphore(self.config.max_concurrency)
            self._asking = asyncio.Lock()

    # -- requests: a failure says which endpoint, which URL and what to do ----------------------
    async def _call(self, request, path: str):
        """Await one API request; its failure becomes an ``EndpointError``."""
        import openai

        try:
            return await request
        except openai.APIError as exc:
            raise self._explain(exc, path) from None

    def _explain(self, exc: BaseException, path: str, tries: int | None = None) -> EndpointError:
        url = path if "://" in path else self.config.base_url.rstrip("/") + path
        return explain(self.config, self.model_id, exc, url, self.config.max_retries + 1 if tries is None else tries)

    # -- what the server says about itself -------------------------------------------------------
    def _adopt(self, models: list[dict[str, Any]]) -> None:
        """Check that the server serves ``config.model``; its ``max_model_len`` is the context unless one was given."""
        found = next((m for m in models if m.get("id") == self.config.model), None)
        if found is None:
            served = [m.get("id") for m in models]
            raise EndpointError(f"{describe(self.model_id)}: the server at {self.config.base_url} serves {served}, "
                                f"not {self.config.model!r}; set {setting(self.model_id, 'model')} to one of those, or "
                                f"start the server with --served-model-name {self.config.model}")
        length = found.get("max_model_len")
        if self.max_context is None and isinstance(length, int) and length > 0:
            self.max_context = length
        self._asked = True

    def check_server(self) -> None:
        """Ask the server which models it serves (``GET /models``), now: raises an ``EndpointError`` unless it answers
        and serves ``config.model``; sets ``max_context`` from its ``max_model_len`` when it was not given. The
        policy's server is checked when its backend is built; other ``vllm`` endpoints before their first request."""
        from openai import APIError, OpenAI

        try:
            with OpenAI(**self._client_options) as client:
                models = [m.model_dump() for m in client.models.list().data]
        except APIError as exc:
            raise self._explain(exc, "/models") from None
        self._adopt(models)

    async def _ask_server(self) -> None:
        async with self._asking:
            if not self._asked:
                page = await self._call(self._client.models.list(), "/models")
                self._adopt([m.model_dump() for m in page.data])

    # -- generation ------------------------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], params: SamplingParams,
                       messages: list[dict[str, Any]] | None = None) -> Generation:
        self._bind_loop()
        if not self._asked:
            await self._ask_server()
        check_context(len(prompt_ids), params.max_new_tokens, self.max_context, self.model_id)
        self.push_pending_weights()  # no await before it: the first request pushes, the others find it done
        async with self._slots:
            self.num_requests += 1
            if self.config.kind == "vllm":
                return await self._generate_tokens(prompt_ids, params)
            return await self._generate_text(prompt_ids, params, messages)

    async def _generate_tokens(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        extra: dict[str, Any] = {"return_token_ids": True, "skip_special_tokens": False}
        if params.allowed_token_ids is not None:
            extra["allowed_token_ids"] = list(params.allowed_token_ids)
        response = await self._call(self._client.completions.create(
            model=self.served_model, prompt=list(prompt_ids), max_tokens=params.max_new_tokens,
            temperature=params.temperature, top_p=params.top_p, seed=params.seed, logprobs=0,
            stop=list(params.stop) or None, extra_body=extra,
        ), "/completions")
        choice = response.choices[0]
        ids = list(getattr(choice, "token_ids", None) or choice.model_extra.get("token_ids") or [])
        logprobs = list(choice.logprobs.token_logprobs) if choice.logprobs is not None else None
        if not ids or logprobs is None or len(logprobs) != len(ids):
            raise RuntimeError(f"{self.model_id}: the server did not return token ids with logprobs; it must be a "
                               "vLLM server (return_token_ids, logprobs)")
        reason = {"stop": "stop", "length": "length"}.get(choice.finish_reason, "stop")
        if params.stop and choice.model_extra.get("stop_reason") in params.stop:
            reason = "stop_string"
        return Generation(ids, [float(x) for x in logprobs], reason)

    async def _generate_text(self, prompt_ids: list[int], params: SamplingParams,
                             messages: list[dict[str, Any]] | None) -> Generation:
        if messages is None:
            raise ValueError(f"{self.model_id} is a chat (text) endpoint: it needs the conversation's messages")
        response = await self._call(self._client.chat.completions.create(
            model=self.served_model, messages=messages, max_tokens=params.max_new_tokens,
            temperature=params.temperature, top_p=params.top_p, seed=params.seed, stop=list(params.stop) or None,
        ), "/chat/completions")
        choice = response.choices[0]
        text = choice.message.content or ""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if choice.finish_reason == "stop" and self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)  # the reply ended its turn
        return Generation(ids or [self.tokenizer.eos_token_id], None, "stop" if choice.finish_reason == "stop"
                          else "length", exact=False)

    # -- teacher scoring ---------------------------------------------------------------------------
    async def score(self, sequences, allowed=None, temperatures=None) -> list[list[float | None]]:
        """Logprob of every token given its prefix, from the server's ``prompt_logprobs``.

        At temperature 1 without constrained tokens only each token's own logprob is asked for; otherwise
        the whole distribution of every position (``prompt_logprobs=-1``: start the server with
        ``--max-logprobs -1``) is read at the token's temperature and restricted to its allowed ids.
        """
        if self.config.kind != "vllm":
            raise ValueError(f"{self.model_id} cannot score tokens: teacher scoring needs a vLLM server")
        self._bind_loop()
        self.push_pending_weights()
        return list(await asyncio.gather(*(
            self._score_one(seq, None if allowed is None else allowed[i], None if temperatures is None
                            else temperatures[i]) for i, seq in enumerate(sequences))))

    async def _score_one(self, sequence, allowed, temperatures) -> list[float | None]:
        if len(sequence) < 2:
            return [None] * len(sequence)
        full = any(a is not None for a in allowed or ()) or any(t not in (None, 1.0) for t in temperatures or ())
        async with self._slots:
            self.num_requests += 1
            response = await self._call(self._client.completions.create(
                model=self.served_model, prompt=list(sequence), max_tokens=1, temperature=1.0,
                extra_body={"prompt_logprobs": -1 if full else 0},
            ), "/completions")
        rows = response.choices[0].model_extra.get("prompt_logprobs")
        if rows is None or len(rows) != len(sequence):
            raise RuntimeError(f"{self.model_id}: the server returned no prompt_logprobs (is it a vLLM server?)")
        out: list[float | None] = [None]
        for j in range(1, len(sequence)):
            row = {int(k): v["logprob"] for k, v in rows[j].items()}
            token = sequence[j]
            temperature = 1.0 if temperatures is None or temperatures[j] is None else float(temperatures[j])
            ids = allowed[j] if allowed is not None and allowed[j] is not None else None
            if not full:
                out.append(row[token])
                continue
            if len(row) < 2 and ids is None:
                raise RuntimeError(f"{self.model_id}: scoring at temperature {temperature} or with constrained choices "
                                   "needs whole distributions: start the server with --max-logprobs -1")
            scaled = {k: lp / temperature for k, lp in row.items() if ids is None or k in ids}
            norm = max(scaled.values())
            norm += math.log(sum(math.exp(v - norm) for v in scaled.values()))
            out.append(scaled[token] - norm)
        return out

    # -- the policy's server: new weights after every optimizer step --------------------------------
    def sync_weights(self, model) -> None:
        """Note ``model``'s weights for the server; they are pushed right before the next request
        ([`DeferredWeightPush`][multiagent_rl.backends.base.DeferredWeightPush], ``push_weights``)."""
        if self.config.kind != "vllm":
            raise ValueError(f"{self.model_id} is not a vLLM server: its weights cannot be updated")
        super().sync_weights(model)

    def handoff_folder(self) -> str | None:
        """The folder weights go through as a file, or None for the HTTP body: ``weights_dir`` when given; with
        ``weight_handoff = "auto"`` (or ``"file"``) and a server on this machine (a loopback URL), a private
        temporary folder; else None (``"http"``, or a remote server without a shared ``weights_dir``)."""
        if self.weight_handoff == "http":
            return None
        if self.weights_dir is not None:
            return self.weights_dir
        host = httpx.URL(self.config.base_url).host
        if host in ("127.0.0.1", "localhost", "::1", "[::1]"):
            if getattr(self, "_own_folder", None) is None:
                import tempfile

                shared = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
                self._own_folder = tempfile.mkdtemp(prefix="multiagent_rl-weights-", dir=shared)
                atexit.register(shutil.rmtree, self._own_folder, ignore_errors=True)
            return self._own_folder
        if self.weight_handoff == "file":
            raise ValueError(f"{describe(self.model_id)}: weight_handoff = 'file' with a server at {self.config.base_url}, "
                             "not on this machine: set [model.vllm] weights_dir to a folder both machines read")
        return None

    def push_weights(self, model) -> None:
        """Push ``model``'s weights into the server now (started with this package's worker extension, see
        [`vllm_sync`][multiagent_rl.backends.vllm_sync]), then drop its prefix cache (cached prompts hold
        activations of the old weights). Through a safetensors file in ``handoff_folder()`` when there is one (the
        server reads it from disk, or from memory under ``/dev/shm``: no copy inside the request), else inside the
        HTTP request as base64. A loopback server that cannot read the file (another container behind a forwarded
        port) is sent the weights over HTTP from then on, with a warning."""
        from .vllm_sync import push_adapter_to_server, served_tensors

        if self.adapter is not None and push_adapter_to_server(self, model):
            return
        tensors = served_tensors(model)
        folder = self.handoff_folder()
        if folder is not None:
            try:
                self._push_file(tensors, folder)
                return
            except EndpointError as exc:
                if self.weights_dir is not None or self.weight_handoff == "file" or "reading" not in str(exc):
                    raise
                logger.warning("%s; sending the weights inside the HTTP request from now on "
                               "([model.vllm] weights_dir: a folder the server shares)", exc)
                self.weight_handoff = "http"
        from safetensors.torch import save

        self._post_weights({"method": "load_safetensors_b64", "args": [base64.b64encode(save(tensors)).decode()]})

    def _push_file(self, tensors: dict, folder: str) -> None:
        from safetensors.torch import save_file

        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"weights-{os.getpid()}.safetensors")
        save_file(tensors, path + ".partial")
        os.replace(path + ".partial", path)  # the server never reads a half-written file
        try:
            self._post_weights({"method": "load_safetensors_file", "args": [os.path.abspath(path)]}, reading=folder)
        finally:
            if os.path.exists(path):
                os.remove(path)

    def _post_weights(self, request: dict, reading: str | None = None) -> None:
        root = self.config.base_url.rstrip("/").removesuffix("/v1")
        url = f"{root}/collective_rpc"
        try:
            with httpx.Client(timeout=self.config.timeout, headers=self._headers) as client:
                reply = client.post(url, json=request)
                if reply.status_code != 200:
                    hint = ("start the server with VLLM_SERVER_DEV_MODE=1 and --worker-extension-cls "
                            "multiagent_rl.backends.vllm_sync.WeightSyncExtension")
                    if reading is not None:
                        hint = (f"the server failed reading the weights from {reading} (it must see that folder: "
                                "set [model.vllm] weights_dir to one it shares, or weight_handoff = 'http'), or " + hint)
                    raise EndpointError(
                        f"{describe(self.model_id)}: pushing weights to {url} failed ({reply.status_code}: "
                        f"{server_message(reply.text, 'no message')}); {hint}")
                url = f"{root}/reset_prefix_cache"
                client.post(url).raise_for_status()
        except httpx.HTTPError as exc:
            raise self._explain(exc, url, 1) from None
