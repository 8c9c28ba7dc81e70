"""Start and stop a local vLLM server with the flags this library's backends need (tests, benchmarks, one-box runs).

    process, url = start_vllm_server("path/to/model", log_path="vllm.log")
    ...  # "vllm:{url}#path/to/model" as a seat's model, or [model.vllm] mode = "server", base_url = url
    stop_vllm_server(process)

The flags ([`server_command`][multiagent_rl.backends.vllm_server.server_command]): ``--logprobs-mode
processed_logprobs`` (logprobs at the sampling temperature, as the trainer computes them), ``--max-logprobs -1`` (whole
distributions for teachers read at another temperature or under constrained choices), this package's weight-sync worker
extension and ``VLLM_SERVER_DEV_MODE=1`` (so a trained policy's weights can be pushed after every optimizer step).
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time

SAMPLING_FLAGS = ("--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1")
"""What every served model needs: logprobs at the sampling temperature, whole distributions for teachers."""
WEIGHT_SYNC_FLAGS = ("--worker-extension-cls", "multiagent_rl.backends.vllm_sync.WeightSyncExtension")
"""What the policy's server needs besides (with ``VLLM_SERVER_DEV_MODE=1``): the trainer's weights pushed in."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(model_path: str, port: int, *, host: str = "127.0.0.1", max_model_len: int = 2048,
                   dtype: str = "auto", seed: int = 0) -> list[str]:
    """The command line of a vLLM OpenAI-compatible server for this library (any extra vLLM flag may be appended)."""
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path, "--dtype", dtype,
            "--max-model-len", str(max_model_len), "--host", host, "--port", str(port), "--seed", str(seed),
            *SAMPLING_FLAGS, *WEIGHT_SYNC_FLAGS]


def shell_command(model: str, host: str = "127.0.0.1", port: int = 8000, *, weight_sync: bool = True) -> str:
    """The shell line that starts a server for ``model`` on ``host:port`` with this library's flags (``weight_sync``:
    also those a trained policy's server needs). Error messages suggest it; on a CPU add ``--dtype float32`` and set
    ``VLLM_CPU_KVCACHE_SPACE`` (docs/vllm_cpu.md).

    ```pycon
    >>> shell_command("Qwen/Qwen2.5-0.5B-Instruct", port=8001, weight_sync=False).split(" --")[1:]
    ['model Qwen/Qwen2.5-0.5B-Instruct', 'host 127.0.0.1', 'port 8001', 'logprobs-mode processed_logprobs', \
'max-logprobs -1']

    ```
    """
    args = ["--model", model, "--host", host, "--port", str(port), *SAMPLING_FLAGS,
            *(WEIGHT_SYNC_FLAGS if weight_sync else ())]
    prefix = "VLLM_SERVER_DEV_MODE=1 " if weight_sync else ""
    return prefix + "python -m vllm.entrypoints.openai.api_server " + shlex.join(args)


def start_vllm_server(model_path: str, *, log_path: str | os.PathLike = "vllm_server.log", port: int | None = None,
                      max_model_len: int = 2048, timeout: float = 300.0, extra_args: list[str] | None = None,
                      env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """Start a server on loopback and wait until it answers ``/health``; returns (process, API root URL)."""
    import httpx
    import torch

    port = port or free_port()
    cpu = not torch.cuda.is_available()
    command = server_command(model_path, port, max_model_len=max_model_len, dtype="float32" if cpu else "auto")
    server_env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", **({"VLLM_CPU_KVCACHE_SPACE": "1"} if cpu else {}),
                  **(env or {})}
    log = open(log_path, "w")
    process = subprocess.Popen(command + list(extra_args or ()), env=server_env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the vLLM server exited with {process.returncode}; its log ({log_path}) ends:\n"
                               + open(log_path).read()[-3000:])
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return process, f"http://127.0.0.1:{port}/v1"
        except httpx.HTTPError:
            pass
        time.sleep(1)
    stop_vllm_server(process)
    raise RuntimeError(f"the vLLM server did not answer /health within {timeout:g} s; see {log_path}")


def stop_vllm_server(process: subprocess.Popen, timeout: float = 30.0) -> None:
    """Stop the server and its engine processes (the whole process group)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
