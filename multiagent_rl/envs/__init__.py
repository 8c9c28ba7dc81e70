"""Built-in environments. Each module is one environment that reads like its rules."""

from __future__ import annotations


def corpus_lines() -> list[str]:
    """Text the embedded tiny tokenizer is trained on, so env words are single tokens."""
    from . import kuhn_poker

    return list(kuhn_poker.corpus_lines())
