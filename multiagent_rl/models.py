"""The embedded default model: a tiny tokenizer + causal LM built fully offline.

``resolve_model("tiny")`` builds (once) and returns the path of a folder holding a byte-level BPE
tokenizer with a ChatML chat template (with a tool-calling format) and a randomly initialised Qwen2-family model, so every code
path that takes a hub id or a local path also runs on a CPU with no network. The tokenizer is
trained on a small corpus shipped with the package (``assets/tiny_corpus.txt``) covering the
built-in environments' words, so words such as ``bet`` or ``fold`` are single tokens; being
byte-level, it still tokenises any text. The cache folder is named by a hash of the corpus, the
tokenizer settings and the architecture, so changing any of them builds a new model.

```pycon
>>> from multiagent_rl.models import load_model_and_tokenizer
>>> model, tok = load_model_and_tokenizer("tiny")  # doctest: +SKIP

```
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path

TINY = "tiny"

CHATML_TEMPLATE = (
    # With tools, the system turn lists their JSON schemas and the call format (the Hermes / Qwen2.5 one the
    # tool harness parses); tool results are turns of role "tool". Without tools it is plain ChatML.
    "{% if tools %}"
    "{{ '<|im_start|>system\n' }}"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\n\n' }}{% endif %}"
    "{{ 'You can call these tools:\n<tools>\n' }}"
    "{% for tool in tools %}{{ tool | tojson }}{{ '\n' }}{% endfor %}"
    "{{ '</tools>\nTo call one, write <tool_call>\n{\"name\": <tool name>, \"arguments\": <JSON object>}\n'"
    " + '</tool_call>' + '<|im_end|>' + '\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if not (tools and loop.first and message['role'] == 'system') %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

TOKENIZER_VOCAB = 1024

TINY_ARCHITECTURE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,  # head_dim 32: vLLM's CPU attention refuses head_dim 16
    num_key_value_heads=1,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
)
"""The Qwen2 configuration of the embedded model (its vocabulary size comes from the tokenizer)."""


def cache_dir() -> Path:
    """Where built models live: ``$MULTIAGENT_RL_CACHE`` or ``~/.cache/multiagent_rl``."""
    return Path(os.environ.get("MULTIAGENT_RL_CACHE", Path.home() / ".cache" / "multiagent_rl"))


def corpus_text() -> str:
    """The tokenizer's training text, shipped with the package: one line per example sentence."""
    return resources.files("multiagent_rl").joinpath("assets/tiny_corpus.txt").read_text(encoding="utf-8")


def _corpus() -> list[str]:
    lines = [line for line in corpus_text().splitlines() if line.strip()]
    # Single-word lines teach the tokenizer the word both at the start of a reply and after a space.
    words = sorted({w.strip(".,!?:;`()") for line in lines for w in line.split()} - {""})
    return lines * 4 + words * 8 + [" ".join(words)] * 4


def tiny_fingerprint() -> str:
    """A hash of everything the tiny model is built from: the corpus, the tokenizer settings, the architecture."""
    recipe = {"corpus": corpus_text(), "vocab": TOKENIZER_VOCAB, "special": SPECIAL_TOKENS, "template": CHATML_TEMPLATE,
              "architecture": TINY_ARCHITECTURE, "seed": 0}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def build_tiny_tokenizer(vocab_size: int = TOKENIZER_VOCAB):
    """Train the byte-level BPE tokenizer on the built-in corpus (deterministic, ~1 s)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        chat_template=CHATML_TEMPLATE,
        model_max_length=2048,
    )


def build_tiny_model(vocab_size: int, seed: int = 0):
    """A randomly initialised Qwen2 causal LM small enough to train on two CPU cores."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        **TINY_ARCHITECTURE,
        bos_token_id=None,
        eos_token_id=2,
        pad_token_id=0,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = [2, 0]
    model.generation_config.pad_token_id = 0
    return model


def tiny_model_path() -> Path:
    """Build the tiny model and tokenizer once (atomically, safe across processes) and return the folder."""
    fingerprint = tiny_fingerprint()
    target = cache_dir() / f"tiny-{fingerprint}"
    if (target / "ready.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="tiny-", dir=target.parent))
    try:
        tokenizer = build_tiny_tokenizer()
        assert tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS) == [0, 1, 2]
        model = build_tiny_model(len(tokenizer))
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "ready.json").write_text(json.dumps({"fingerprint": fingerprint}))
        try:
            os.rename(tmp, target)
        except OSError:  # another process finished first; theirs is identical
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model(model_id: str) -> str:
    """Map ``"tiny"`` to the embedded model's folder; hub ids and local paths pass through."""
    return str(tiny_model_path()) if model_id == TINY else model_id


class ModelNotFoundError(OSError):
    """A model id that is neither ``"tiny"``, a local model folder nor a Hub model that could be fetched."""


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
        f"model {model_id!r} could not be loaded: {tried}. Use 'tiny' (the embedded model), a local folder with "
        f"config.json and weights, or a Hub id (check the spelling; a download needs network). Cause: "
        f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    )


def load_tokenizer(model_id: str):
    """The tokenizer of ``model_id`` (``"tiny"``, a Hub id or a local path), with a pad token."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(resolve_model(model_id))
    except OSError as exc:
        raise _not_found(model_id, exc) from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model_and_tokenizer(model_id: str, *, dtype=None, device=None):
    """Load a causal LM and its tokenizer by id (``"tiny"``, a hub id or a local path).

    On CPU the default dtype is float32 (bf16 matmuls are slow and inexact there).
    """
    import torch
    from transformers import AutoModelForCausalLM

    path = resolve_model(model_id)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype is None:
        dtype = torch.bfloat16 if str(device).startswith("cuda") and torch.cuda.is_bf16_supported() else torch.float32
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    except OSError as exc:
        raise _not_found(model_id, exc) from None
    return model, load_tokenizer(model_id)
