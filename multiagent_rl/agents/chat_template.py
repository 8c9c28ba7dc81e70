"""Chat templates as token pieces: how a conversation becomes tokens, one message at a time.

[`ChatTemplate`][multiagent_rl.agents.chat_template.ChatTemplate] derives, from a tokenizer's own chat template, the tokens of
a prompt, of a new user turn appended after a reply (so multi-turn traces are extended, never re-tokenised) and of
each reply a constrained choice allows. The agents' harness ([`multiagent_rl.agents.agent`][]) and the
evaluations that must read a model at exactly the tokens it saw in play both build on it.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any


def check_encodable(text: str) -> None:
    """Raise a clear ValueError for text a tokenizer cannot take (lone surrogates are not UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"text cannot be encoded as UTF-8 ({exc.reason} at position {exc.start}: {text[exc.start:exc.end]!r}); "
            "remove lone surrogates, e.g. text.encode('utf-8', 'replace').decode()"
        ) from None


class ChatTemplate:
    """Token pieces of a chat template, derived once per tokenizer from the template itself."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        probe = [{"role": "user", "content": "PROBE_U"}, {"role": "assistant", "content": "PROBE_A"}]
        closed = self._render(probe, add_generation_prompt=False)
        self.turn_close = closed[closed.index("PROBE_A") + len("PROBE_A") :]
        eos = tokenizer.eos_token or ""
        self.eos_text = eos if eos and self.turn_close.startswith(eos) else ""
        # Envs repeat the same messages across thousands of episodes: render each one once (bounded LRU).
        self._prompt_cache: OrderedDict[str, list[int]] = OrderedDict()
        self._turn_cache: OrderedDict[tuple[str, bool], list[int]] = OrderedDict()
        self._choice_cache: dict[tuple[str, ...], dict[str, list[int]]] = {}

    def _render(self, messages, add_generation_prompt, tools=None) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        check_encodable(text)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def ends_turn(self, reply_ids: list[int]) -> bool:
        """Whether a reply's tokens closed the assistant turn with the template's own end-of-turn token
        (any other stop leaves the full turn close to be added before the next user message)."""
        return bool(self.eos_text) and reply_ids[-1:] == [self.tokenizer.eos_token_id]

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """The first prompt: ``messages`` rendered with the generation prompt, and ``tools`` (JSON schemas) as the
        template presents them (a template that ignores ``tools`` is refused: the model would never see them)."""
        def render():
            text = self._render(messages, add_generation_prompt=True, tools=tools or None)
            if tools and text == self._render(messages, add_generation_prompt=True):
                raise ValueError(
                    "this tokenizer's chat template ignores `tools`, so the model would never see its tools; use a "
                    "model whose template renders tools (e.g. Qwen2.5/Qwen3 instruct, or the embedded tiny model)"
                )
            return self.encode(text)

        return _cached(self._prompt_cache, json.dumps([messages, tools]), render)

    def choice_ids(self, choices: tuple[str, ...]) -> dict[str, list[int]]:
        """Each choice's reply tokens (its text + the end-of-turn token), checked to be told apart."""
        if choices not in self._choice_cache:
            if not choices:
                raise ValueError("choices must name at least one reply")
            options = {c: self.encode(c + self.eos_text) for c in choices}
            for a, ids_a in options.items():
                for b, ids_b in options.items():
                    if a != b and ids_b[: len(ids_a)] == ids_a:
                        raise ValueError(
                            f"choice {a!r} tokenizes to a prefix of {b!r} ({ids_a} vs {ids_b}), so a constrained "
                            "reply cannot tell them apart; use a chat template with an end-of-turn token or "
                            "choices that are not prefixes of one another"
                        )
            self._choice_cache[choices] = options
        return {c: list(ids) for c, ids in self._choice_cache[choices].items()}

    def user_turn_ids(self, content: str, reply_ended_turn: bool) -> list[int]:
        """Tokens that close the last reply (if the model did not) and open a new user turn."""
        return self.turn_ids([{"role": "user", "content": content}], reply_ended_turn)

    def turn_ids(self, messages: list[dict[str, Any]], reply_ended_turn: bool) -> list[int]:
        """Tokens that close the last reply (if the model did not), then ``messages`` (user or tool results) as
        the template renders them after an assistant reply, then the generation prompt. Tool results of one
        reply come as one list: some templates (Qwen's) group consecutive tool messages into one turn."""
        return _cached(self._turn_cache, (json.dumps(messages), reply_ended_turn),
                       lambda: self._turn_ids(messages, reply_ended_turn))

    def _turn_ids(self, messages: list[dict[str, Any]], reply_ended_turn: bool) -> list[int]:
        probe = [{"role": "user", "content": "PROBE_U"}, {"role": "assistant", "content": "PROBE_A"}]
        before = self._render(probe, add_generation_prompt=False)
        after = self._render(probe + messages, add_generation_prompt=True)
        if not after.startswith(before):
            raise ValueError(
                "This chat template re-renders earlier turns when a message is added, so observations cannot be "
                "appended token-exactly; use a template whose rendering of a prefix is a prefix."
            )
        close = self.turn_close[len(self.eos_text) :] if reply_ended_turn else self.turn_close
        return self.encode(close + after[len(before) :])


def _cached(cache: OrderedDict, key, compute, size: int = 4096) -> list[int]:
    if key in cache:
        cache.move_to_end(key)
    else:
        cache[key] = compute()
        if len(cache) > size:
            cache.popitem(last=False)
    return list(cache[key])


def next_ids(options: dict[str, list[int]], prefix: list[int]) -> list[int]:
    """The token ids that continue ``prefix`` towards some option."""
    n = len(prefix)
    return sorted({o[n] for o in options.values() if len(o) > n and o[:n] == prefix})


def choice_steps(options: dict[str, list[int]], ids: list[int]) -> list[list[int]]:
    """Per token of the option ``ids``, the ids a constrained reply could pick at that step."""
    return [next_ids(options, ids[:i]) for i in range(len(ids))]
