"""``[model.vllm]``: how the vLLM backends (colocated engine or a server) sample the policy and receive its weights."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class VLLMConfig(BaseModel):
    """How the policy is sampled with vLLM (``[model] backend = "vllm"``)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    mode: Literal["colocate", "server"] = "colocate"
    """``colocate``: an in-process engine on the trainer's device; ``server``: a vLLM server you started (see
    docs/scaling.md for its flags), sent the trainer's weights after every optimizer step."""
    base_url: str | None = None
    """Server mode: the server's API root, e.g. ``http://127.0.0.1:8000/v1``."""
    served_model: str | None = None
    """Server mode: the model name the server serves (default: the model's path, as ``--model`` was given)."""
    api_key_env: str | None = None
    """Server mode: the environment variable holding the server's API key, if it has one."""
    timeout: float = Field(300.0, gt=0)
    """Server mode: seconds one request may take."""
    max_concurrency: int = Field(256, ge=1)
    """Server mode: most requests in flight."""
    max_model_len: int = Field(2048, ge=16)
    """Context length of the engine (prompt + reply)."""
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1)
    """Colocate mode on a GPU: the share of its memory vLLM may take (the trainer needs the rest)."""
    kv_cache_memory_bytes: int | None = Field(None, ge=1)
    """Colocate mode: bytes of KV cache (default on CPU: 64 MiB)."""
    weight_handoff: Literal["auto", "file", "http"] = "auto"
    """Server mode: how new weights reach the server. ``file``: a safetensors file the server reads from
    ``weights_dir`` (default for a server on this machine: a private folder under ``/dev/shm``); ``http``: the
    file's bytes, base64, inside the request; ``auto``: ``file`` when the server can see the folder (a loopback URL
    or a ``weights_dir``), else ``http``. Costs per step: docs/scaling.md."""
    weights_dir: str | None = None
    """Server mode: a folder both this process and the server read and write (a shared filesystem), for
    ``weight_handoff`` ``file``/``auto`` with a server on another machine."""

    @model_validator(mode="after")
    def _check(self):
        if self.mode == "server" and not self.base_url:
            raise ValueError("[model.vllm] mode = 'server' needs base_url (e.g. 'http://127.0.0.1:8000/v1')")
        return self
