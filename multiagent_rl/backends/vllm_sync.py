"""New weights into a running vLLM engine, after an optimizer step, when it next samples.

On CPU, vLLM repacks every linear layer's weight into a oneDNN handle when it loads a model (the layer's
``weight`` parameter is emptied), so loading tensors straight into the model — what TRL's colocated sync
does — cannot refresh them, and TRL's server sync needs NCCL (CUDA). vLLM's own ``reload_weights`` does
re-run each reloaded layer's post-processing, except for a language-model head tied to the embeddings: it
receives no tensor of its own and keeps a packed copy of the old embeddings. So:

- in-process (``VLLMColocatedBackend``): [`push_weights`][multiagent_rl.backends.vllm_sync.push_weights] reloads,
re-packs a tied head, resets the
  prefix cache (its cached prompts hold activations of the old weights);
- a server started with ``--worker-extension-cls multiagent_rl.backends.vllm_sync.WeightSyncExtension`` and
  ``VLLM_SERVER_DEV_MODE=1`` takes the weights at ``POST /collective_rpc`` as a safetensors file it reads
  (``{"method": "load_safetensors_file", "args": [path]}``: a server on the same machine, or any server that shares
  ``[model.vllm] weights_dir``) or as a base64 blob inside the request (``load_safetensors_b64``), then
  ``POST /reset_prefix_cache`` (``EndpointBackend.push_weights`` does both).

A LoRA policy on the in-process engine goes over as its adapter, not merged into the base: the engine runs with vLLM's
LoRA support, each push writes the adapter (PEFT's own files) to a new folder and the engine samples it through a new
``LoRARequest`` ([`push_adapter`][multiagent_rl.backends.vllm_sync.push_adapter]); the base weights never move, and
several policies are several adapters on one engine.

Either way the push waits until the sampler is next asked for a sample or a score
([`DeferredWeightPush`][multiagent_rl.backends.base.DeferredWeightPush]): steps where the policy samples nothing
move no weights.

Measured on CPU with vLLM 0.32: after a push, vLLM's logprobs equal the trainer's to 5e-6.
"""

from __future__ import annotations

import base64
import itertools
import os
import shutil
from typing import Any

_ADAPTER_IDS = itertools.count(1)


def served_tensors(model: Any) -> dict[str, Any]:
    """The model's weights under the names vLLM loads (a PEFT adapter merged into its base), without a tied head."""
    if hasattr(model, "merge_adapter"):  # a PEFT model: serve the merged weights (vLLM's LoRA is not used)
        model.merge_adapter()
        try:
            state = {
                name.removeprefix("base_model.model.").replace(".base_layer", ""): tensor.detach().clone()
                for name, tensor in model.state_dict().items() if "lora_" not in name
            }
        finally:
            model.unmerge_adapter()
    else:
        state = {name: tensor.detach() for name, tensor in model.state_dict().items()}
    config = getattr(model, "config", None)
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # it is the embedding; vLLM re-packs it from there
    return {name: tensor.contiguous() for name, tensor in state.items()}


def _repack_tied_head(model: Any) -> None:
    """Re-pack a CPU language-model head that shares the (just reloaded) embedding weights."""
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is None or embed is None or getattr(head, "weight", None) is not getattr(embed, "weight", None):
        return
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        dispatch_cpu_unquantized_gemm(head, remove_weight=False)


def load_into_worker(worker: Any, named_tensors: list[tuple[str, Any]]) -> int:
    """Inside a vLLM worker: reload the given tensors and fix a tied head."""
    worker.reload_weights(weights_iterator=named_tensors, is_checkpoint_format=True)
    _repack_tied_head(worker.model_runner.model)
    return len(named_tensors)


class WeightSyncExtension:
    """A vLLM worker extension (``--worker-extension-cls``): over ``/collective_rpc``, ``load_safetensors_file(path)``
    (a file the trainer wrote where the server can read it) or ``load_safetensors_b64(blob)`` (the file's bytes
    inside the request)."""

    def load_safetensors_file(self, path: str) -> int:
        from safetensors.torch import load_file

        return load_into_worker(self, list(load_file(path).items()))

    def load_safetensors_b64(self, data: str) -> int:
        from safetensors.torch import load

        return load_into_worker(self, list(load(base64.b64decode(data)).items()))


def push_weights(llm: Any, model: Any) -> None:
    """Into an in-process ``vllm.LLM`` (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): reload, re-pack, reset the cache."""
    named = list(served_tensors(model).items())
    llm.collective_rpc(lambda worker: load_into_worker(worker, named))
    llm.reset_prefix_cache()


def push_adapter(llm: Any, model: Any, adapter: str, previous: Any, folder: str):
    """Write PEFT adapter ``adapter`` of ``model`` to a new folder under ``folder`` and return the ``LoRARequest`` that
    samples it (a new id: vLLM keeps adapters by id); the ``previous`` request's adapter leaves the engine and its
    folder is removed."""
    from vllm.lora.request import LoRARequest

    version = next(_ADAPTER_IDS)
    path = os.path.join(folder, f"{adapter}-{version}")
    model.save_pretrained(path, selected_adapters=[adapter])
    saved = path if adapter == "default" else os.path.join(path, adapter)  # PEFT nests a named adapter's files
    request = LoRARequest(f"{adapter}-{version}", version, saved)
    if previous is not None:
        llm.llm_engine.remove_lora(previous.lora_int_id)
        shutil.rmtree(os.path.dirname(previous.lora_path) if adapter != "default" else previous.lora_path,
                      ignore_errors=True)
    return request


def push_adapter_to_server(backend: Any, model: Any) -> bool:
    """Push ``backend.adapter`` (a PEFT adapter of ``model``) to a vLLM server as a LoRA adapter: written to a folder the
    server reads (``backend.handoff_folder()``), loaded with ``POST /v1/load_lora_adapter`` in place under one name,
    the server's prefix cache reset; requests then ask for the adapter by that name. The server needs ``--enable-lora
    --max-lora-rank R`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``. Returns False, having warned and switched the
    backend to merged weights for good, when the server has no runtime LoRA or cannot share a folder."""
    import logging

    import httpx

    from .endpoint_errors import EndpointError, server_message

    log = logging.getLogger(__name__)
    folder, adapter = backend.handoff_folder(), backend.adapter
    if folder is None:
        log.warning("%s: a LoRA adapter goes to the server through a folder it reads (a loopback server, or "
                    "[model.vllm] weights_dir); sending merged weights instead", backend.model_id)
        backend.adapter = None
        return False
    path = os.path.join(folder, f"adapter-{adapter}-{next(_ADAPTER_IDS)}")
    model.save_pretrained(path, selected_adapters=[adapter])
    saved = path if adapter == "default" else os.path.join(path, adapter)  # PEFT nests a named adapter's files
    name = f"multiagent_rl-{adapter}"
    root = backend.config.base_url.rstrip("/").removesuffix("/v1")
    with httpx.Client(timeout=backend.config.timeout, headers=backend._headers) as client:
        reply = client.post(f"{root}/v1/load_lora_adapter",
                            json={"lora_name": name, "lora_path": os.path.abspath(saved), "load_inplace": True})
        if reply.status_code != 200:
            shutil.rmtree(path, ignore_errors=True)
            first = getattr(backend, "_adapter_path", None) is None
            message = server_message(reply.text, "no message")
            if first and reply.status_code in (400, 404) and getattr(backend, "may_merge", True):
                log.warning("%s: the server takes no LoRA adapters at runtime (%s: %s; start it with --enable-lora "
                            "--max-lora-rank R and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True); sending merged weights "
                            "instead", backend.model_id, reply.status_code, message)
                backend.adapter = None
                return False
            raise EndpointError(f"{backend.model_id}: loading the LoRA adapter from {saved} failed "
                                f"({reply.status_code}: {message}); several policies on one server need it started "
                                "with --enable-lora --max-loras K --max-lora-rank R and "
                                "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True")
        client.post(f"{root}/reset_prefix_cache").raise_for_status()
    previous, backend._adapter_path = getattr(backend, "_adapter_path", None), path
    if previous is not None:
        shutil.rmtree(previous, ignore_errors=True)
    backend.served_model = name
    return True
