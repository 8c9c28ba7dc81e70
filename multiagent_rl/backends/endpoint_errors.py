"""Failed requests to a served model, explained: which endpoint, which URL, what went wrong, what to change.

A bare ``APIConnectionError: Connection error.`` (or ``httpx.ConnectError`` at the end of thirty frames, or a 404
with no word on why) tells a user neither which server nor what to do. An ``EndpointError`` says it on one line,
the line an episode's recorded error and a stopped run's summary (``RunStopped``) quote, e.g.::

    endpoint 'opp' ([endpoints.opp], seats with model = 'endpoint:opp'): nothing answers at
    http://127.0.0.1:8001/v1/models (connection refused, 4 tries). Is the server up? Start it with: python -m
    vllm.entrypoints.openai.api_server --model ... --port 8001 ...; or correct the port in [endpoints.opp] base_url

The endpoint is named by the model reference its seats use (``"policy"`` for the trained policy's own server,
``"endpoint:NAME"`` or ``"vllm:URL#MODEL"``); the backend is shared by every seat bound to it, so the seat's role is
named by whoever records the error (an episode's error starts with its env).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import httpx


class EndpointError(RuntimeError):
    """A served model could not answer. The message, on one line, names the endpoint (and the setting that
    configures it), the URL, what went wrong and the likely fix."""


def error_chain(exc: BaseException | None):
    """``exc`` and the exceptions it was raised from or while handling (``__cause__``, else ``__context__``)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def server_message(body: Any, fallback: str) -> str:
    """The server's own words from an error body (vLLM/OpenAI ``{"error": {"message"}}``, FastAPI ``{"detail"}``).

    ```pycon
    >>> server_message({"error": {"message": "The model `x` does not exist."}}, "?")
    'The model `x` does not exist.'
    >>> server_message({"detail": "Not Found"}, "?")
    'Not Found'

    ```
    """
    if isinstance(body, dict):
        inner = body.get("error", body)
        for value in (inner.get("message"), inner.get("detail")) if isinstance(inner, dict) else ():
            if isinstance(value, str):
                return value
        if isinstance(body.get("detail"), str):
            return body["detail"]
    if isinstance(body, str) and body.strip():
        return body.strip()[:300]
    return fallback


def _tries(n: int) -> str:
    return "1 try" if n == 1 else f"{n} tries"


def describe(model_id: str) -> str:
    """The endpoint as messages name it, with the setting that configures it.

    ```pycon
    >>> describe("endpoint:judge")
    "endpoint 'judge' ([endpoints.judge], seats with model = 'endpoint:judge')"

    ```
    """
    if model_id == "policy":
        return "the policy's vLLM server ([model.vllm])"
    if model_id.startswith("endpoint:"):
        name = model_id.partition(":")[2]
        return f"endpoint {name!r} ([endpoints.{name}], seats with model = {model_id!r})"
    return f"served model {model_id!r}"


def setting(model_id: str, field: str) -> str:
    """Where the user sets ``field`` (an ``EndpointConfig`` field) of the endpoint ``model_id`` names.

    ```pycon
    >>> setting("policy", "model"), setting("endpoint:judge", "base_url")
    ('[model.vllm] served_model', '[endpoints.judge] base_url')

    ```
    """
    if model_id == "policy":
        return f"[model.vllm] {'served_model' if field == 'model' else field}"
    if model_id.startswith("endpoint:"):
        return f"[endpoints.{model_id.partition(':')[2]}] {field}"
    if field in ("base_url", "model"):
        return f"the {field} in the model reference {model_id!r}"
    return f"{field} (give the server an [endpoints.NAME] table to set it)"


def start_hint(config: Any, model_id: str) -> str:
    """What to do when nothing answers at ``config.base_url``: the command that starts the server, or the port."""
    if config.kind != "vllm":
        return f"Is the service up, and are the host and port in {setting(model_id, 'base_url')} right?"
    from .vllm_server import shell_command

    where = urlsplit(config.base_url)
    command = shell_command(config.model, where.hostname or "127.0.0.1", where.port or 80,
                            weight_sync=model_id == "policy")
    return (f"Is the server up? Start it with: {command} (on a CPU see docs/vllm_cpu.md); or correct the port in "
            f"{setting(model_id, 'base_url')}")


def status_error(config: Any, model_id: str, status: int, message: str, url: str) -> EndpointError:
    """An HTTP error answer, explained: a 404 under a ``base_url`` without ``/v1``, an unknown model, a refused key."""
    root = config.base_url.rstrip("/")
    if status == 404 and not urlsplit(root).path.endswith("/v1"):
        fix = (f"base_url must be the API root, which ends in /v1 for vLLM: add /v1 to {setting(model_id, 'base_url')} "
               f"({root}/v1)" if config.kind == "vllm" else
               f"is {setting(model_id, 'base_url')} the API root (most end in /v1)?")
    elif status == 404 and url.endswith("/models"):
        fix = (f"is {setting(model_id, 'base_url')} the API root of an OpenAI-compatible server (vLLM's is "
               "http://HOST:PORT/v1)?")
    elif status == 404:
        fix = (f"is {setting(model_id, 'model')} = {config.model!r} a model the server serves? GET {root}/models lists "
               "them (vLLM serves --model's value unless --served-model-name is given)")
    elif status in (401, 403):
        fix = (f"the server refused the API key: check the environment variable "
               f"{config.api_key_env or 'OPENAI_API_KEY'} ({setting(model_id, 'api_key_env')})")
    else:
        fix = ""
    return EndpointError(f"{describe(model_id)}: {url} answered {status} ({message})" + (f"; {fix}" if fix else ""))


def explain(config: Any, model_id: str, exc: BaseException, url: str, tries: int) -> EndpointError:
    """A failed request to ``url`` (an ``openai`` or ``httpx`` error, after ``tries`` attempts) as an
    ``EndpointError``. Raise it ``from None``: the message says all, the client library's frames say nothing more."""
    import openai

    who = describe(model_id)
    if isinstance(exc, openai.APIStatusError):
        return status_error(config, model_id, exc.status_code, server_message(exc.body, exc.message), url)
    if isinstance(exc, httpx.HTTPStatusError):
        return status_error(config, model_id, exc.response.status_code, server_message(exc.response.text, "error"),
                            url)
    if isinstance(exc, (openai.APITimeoutError, httpx.TimeoutException)):
        return EndpointError(f"{who}: no reply from {url} within {config.timeout:g} s ({_tries(tries)}): the server is "
                             f"overloaded or stuck; raise {setting(model_id, 'timeout')} or lower "
                             f"{setting(model_id, 'max_concurrency')}")
    if any(isinstance(e, ConnectionRefusedError) for e in error_chain(exc)):
        return EndpointError(f"{who}: nothing answers at {url} (connection refused, {_tries(tries)}). "
                             f"{start_hint(config, model_id)}")
    if isinstance(exc, (openai.APIConnectionError, httpx.TransportError)):
        cause = list(error_chain(exc))[-1]
        return EndpointError(f"{who}: cannot reach {url} ({type(cause).__name__}: {cause}); check the host and port "
                             f"in {setting(model_id, 'base_url')}")
    return EndpointError(f"{who}: {url} failed: {type(exc).__name__}: {exc}")
