"""The embedded tiny model: a byte-level BPE tokenizer and a random Qwen2 causal LM, built fully offline.

``write_tiny`` writes a folder holding a byte-level BPE tokenizer with a ChatML chat template (with a tool-calling
format) and a randomly initialised Qwen2-family model, so every code path that takes a hub id or a local path also
runs on a CPU with no network (``resolve_model("tiny")`` builds it once into the cache). The tokenizer is trained on
a small corpus shipped with the package (``assets/tiny_corpus.txt``) covering the built-in environments' words, so
words such as ``bet`` or ``fold`` are single tokens; being byte-level, it still tokenises any text. The cache folder
is named by ``tiny_fingerprint``, a hash of the corpus, the tokenizer settings and the architecture, so changing any
of them builds a new model.

```pycon
>>> from multiagent_rl.models import load_model_and_tokenizer
>>> model, tok = load_model_and_tokenizer("tiny")  # doctest: +SKIP

```
"""

from __future__ import annotations

import hashlib
import json
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


def write_tiny(folder: Path) -> None:
    """Write the tiny tokenizer and model into ``folder`` (an empty folder; the cache builds it under a temporary
    name and renames it into place)."""
    tokenizer = build_tiny_tokenizer()
    # The model's eos/pad ids (build_tiny_model) and the backends' stop tokens rely on this order.
    if tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS) != [0, 1, 2]:
        raise RuntimeError(f"the tiny tokenizer's special tokens are not ids 0, 1, 2: {SPECIAL_TOKENS}")
    build_tiny_model(len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
