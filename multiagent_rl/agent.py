"""Agents: a harness × a model × sampling settings.

``await agent.run(task)`` plays one single-turn chat and returns a :class:`Trace`;
``agent.interaction(task)`` hands turn-by-turn control to the environment, which speaks as the
user. Multi-turn traces are token-exact: each new user message is appended as observation tokens
(the chat template's rendering of just that message), never by re-tokenising the whole chat, so
the tokens the model saw at turn k+1 are exactly turn k's context + its completion + the new
observation.

A seat is bound to the live policy (the trainer passes its backend), a frozen local model (a path,
a hub id or ``"tiny"``), or a scripted Python function::

    agent = make_agent(AgentConfig(model="tiny", harness={"id": "chat"}))
    async with agent:
        trace = await agent.run(task)
"""

from __future__ import annotations

import asyncio
import inspect
import json
import random
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from pydantic import BaseModel, ConfigDict, Field

from .backends.base import GenerationBackend, SamplingParams
from .task import Task
from .trace import Trace

POLICY = "policy"
SCRIPTED = "scripted"


class ChatHarnessConfig(BaseModel):
    """The chat harness: a conversation rendered with the tokenizer's chat template."""

    model_config = ConfigDict(extra="forbid")

    id: str = "chat"
    max_turns: int = Field(16, ge=1)
    """Most assistant replies in one interaction; one more ``send`` raises :class:`TurnLimitReached`."""
    system_prompt: str | None = None
    """Used when the task has no system prompt of its own."""


class AgentConfig(BaseModel):
    """How to build one agent.

    ``model`` is ``"tiny"`` (embedded), a hub id or a local path (a frozen model), ``"policy"``
    (bound to the live policy by the trainer) or ``"scripted"`` (then ``policy`` is the function).
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    model: str = "tiny"
    harness: ChatHarnessConfig = Field(default_factory=ChatHarnessConfig)
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    policy: Callable[..., Any] | None = None
    """Scripted agents: ``policy(turn: ScriptedTurn) -> str`` (sync or async)."""
    tokenizer: str | None = None
    """Scripted agents: tokenizer that turns their replies into trace tokens (default: ``"tiny"``)."""
    timeout: float | None = Field(None, gt=0)
    """Seconds one reply may take; a slower reply raises ``TimeoutError`` inside the episode."""


class TurnLimitReached(RuntimeError):
    """Raised by ``Interaction.send`` past the harness's ``max_turns``."""


class ReplyTimeout(TimeoutError):
    """Raised by ``Interaction.send`` when a reply takes longer than the agent's per-reply ``timeout``."""


@dataclass
class ScriptedTurn:
    """What a scripted policy sees: the chat so far, the task and the env's structured state."""

    messages: list[dict[str, Any]]
    task: Task
    state: Any = None
    choices: tuple[str, ...] | None = None
    """The replies the env allows this turn (``send(..., choices=...)``); None = free text."""
    rng: random.Random = field(default_factory=random.Random)
    """This seat's random stream for the episode. Under a trainer it is seeded from the run's seed, the
    episode id and the role, so scripted randomness is reproducible and resumes exactly; draw from it
    instead of keeping a generator of your own."""


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

    def _render(self, messages, add_generation_prompt) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        check_encodable(text)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        return _cached(self._prompt_cache, json.dumps(messages),
                       lambda: self.encode(self._render(messages, add_generation_prompt=True)))

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
        return _cached(self._turn_cache, (content, reply_ended_turn),
                       lambda: self._user_turn_ids(content, reply_ended_turn))

    def _user_turn_ids(self, content: str, reply_ended_turn: bool) -> list[int]:
        probe = [{"role": "user", "content": "PROBE_U"}, {"role": "assistant", "content": "PROBE_A"}]
        before = self._render(probe, add_generation_prompt=False)
        after = self._render(probe + [{"role": "user", "content": content}], add_generation_prompt=True)
        if not after.startswith(before):
            raise ValueError(
                "This chat template re-renders earlier turns when a message is added, so observations cannot be "
                "appended token-exactly; use a template whose rendering of a prefix is a prefix."
            )
        close = self.turn_close[len(self.eos_text) :] if reply_ended_turn else self.turn_close
        return self.encode(close + after[len(before) :])


def check_encodable(text: str) -> None:
    """Raise a clear ValueError for text a tokenizer cannot take (lone surrogates are not UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"text cannot be encoded as UTF-8 ({exc.reason} at position {exc.start}: {text[exc.start:exc.end]!r}); "
            "remove lone surrogates, e.g. text.encode('utf-8', 'replace').decode()"
        ) from None


def _cached(cache: OrderedDict, key, compute, size: int = 4096) -> list[int]:
    if key in cache:
        cache.move_to_end(key)
    else:
        cache[key] = compute()
        if len(cache) > size:
            cache.popitem(last=False)
    return list(cache[key])


class Agent:
    """One seat's player. Shared by all concurrent episodes; each run builds its own trace."""

    def __init__(self, config: AgentConfig, backend: GenerationBackend | None = None, tokenizer=None):
        self.config = config
        self.backend = backend
        if config.model == SCRIPTED:
            if config.policy is None:
                raise ValueError("AgentConfig(model='scripted') needs policy=<function(turn) -> str>")
        elif backend is None:
            raise ValueError(f"Agent for model {config.model!r} needs a generation backend; use make_agent()")
        self.tokenizer = tokenizer if tokenizer is not None else getattr(backend, "tokenizer", None)
        if self.tokenizer is None:
            raise ValueError("Agent needs a tokenizer to record token-level traces")
        self.template = ChatTemplate(self.tokenizer)

    @property
    def model_id(self) -> str:
        return SCRIPTED if self.backend is None else self.backend.model_id

    async def __aenter__(self) -> Agent:
        return self

    async def __aexit__(self, *exc) -> None:
        return None

    def interaction(self, task: Task, rng: random.Random | None = None, **sampling_overrides) -> Interaction:
        """Turn-by-turn control: ``reply = await it.send(user_text)``; ``it.trace`` is the run so far.

        ``rng`` is handed to a scripted policy as ``turn.rng`` (default: a fresh unseeded generator).
        """
        return Interaction(self, task, self.config.sampling.with_overrides(**sampling_overrides), rng)

    async def run(self, task: Task, **sampling_overrides) -> Trace:
        """Single-turn chat on the task's prompt: one reply, one trace."""
        async with self.interaction(task, **sampling_overrides) as it:
            await it.send()
        return it.trace


class Interaction:
    """A conversation between the environment (as the user) and one agent."""

    def __init__(self, agent: Agent, task: Task, sampling: SamplingParams, rng: random.Random | None = None):
        self.agent = agent
        self.task = task
        self.sampling = sampling
        self.rng = rng if rng is not None else random.Random()
        self.trace = Trace(model=agent.model_id)
        self.turns = 0
        self.waiting = False
        """True while a reply is being produced (an episode timeout names the roles it was waiting for)."""
        self._reply_ended_turn = True
        self._on_close: list[Callable[[Trace], None]] = []

    async def __aenter__(self) -> Interaction:
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if exc is not None and self.trace.error is None:
            self.trace.error = f"{type(exc).__name__}: {exc}"
        self.close()

    def close(self) -> Trace:
        callbacks, self._on_close = self._on_close, []
        for cb in callbacks:
            cb(self.trace)
        return self.trace

    async def send(
        self, text: str | None = None, *, state: Any = None, choices: Sequence[str] | None = None, **sampling_overrides
    ) -> str:
        """Say ``text`` as the user (the task's prompt on the first turn if None) and return the reply.

        With ``choices`` the reply is constrained to one of them (a legal-action harness): the
        model samples only tokens that continue some choice, each from the softmax over exactly
        those tokens, and the trace records the allowed ids so the loss scores every token with the
        same restricted softmax. Each choice is followed by the template's end-of-turn token.
        """
        agent, trace = self.agent, self.trace
        if self.turns >= agent.config.harness.max_turns:
            raise TurnLimitReached(f"{trace.agent}: max_turns={agent.config.harness.max_turns} reached")
        if text is not None:
            check_encodable(text)
        if not trace.segments:
            system = self.task.data.system_prompt or agent.config.harness.system_prompt
            if system:
                trace.messages.append({"role": "system", "content": system})
            trace.messages.append({"role": "user", "content": self.task.data.prompt if text is None else text})
            trace.append("prompt", agent.template.prompt_ids(trace.messages))
        else:
            if text is None:
                raise ValueError("send() after the first turn needs the user's text")
            trace.messages.append({"role": "user", "content": text})
            trace.append("observation", agent.template.user_turn_ids(text, self._reply_ended_turn))
        params = self.sampling.with_overrides(**sampling_overrides)
        reply_coro = self._reply(params, state) if choices is None else self._choose(params, state, tuple(choices))
        self.waiting = True  # stays True if the episode is cancelled meanwhile: its timeout names this seat
        try:
            reply = await asyncio.wait_for(reply_coro, timeout=agent.config.timeout)
        except asyncio.TimeoutError:
            self.waiting = False
            raise ReplyTimeout(
                f"role {trace.agent!r} ({agent.model_id}): no reply within {agent.config.timeout:g} s "
                "(the per-reply timeout: `timeout` of the role's config)"
            ) from None
        self.waiting = False
        self.turns += 1
        trace.messages.append({"role": "assistant", "content": reply})
        trace.last_reply = reply
        return reply

    async def _reply(self, params: SamplingParams, state: Any) -> str:
        agent, trace = self.agent, self.trace
        tok = agent.tokenizer
        if agent.backend is None:  # scripted
            reply = await self._scripted_reply(state)
            # A scripted reply obeys the same length limit as a sampled one, so imitating it (sft)
            # teaches exactly what the policy can emit; the end-of-turn token is kept when it fits.
            ids = agent.template.encode(reply + agent.template.eos_text)[: params.max_new_tokens]
            trace.append("action", ids)
            self._reply_ended_turn = bool(agent.template.eos_text) and ids[-1:] == [tok.eos_token_id]
            return tok.decode(ids, skip_special_tokens=True)
        gen = await agent.backend.generate(trace.token_ids, params)
        trace.append("action", gen.token_ids, gen.logprobs, temperature=params.temperature)
        # Only the template's own end-of-turn token closes the turn; any other stop token is followed by the full close.
        self._reply_ended_turn = bool(agent.template.eos_text) and gen.token_ids[-1:] == [tok.eos_token_id]
        text = tok.decode(gen.token_ids, skip_special_tokens=True)
        for s in params.stop:
            if s in text:
                text = text[: text.index(s)]
        return text

    async def _scripted_reply(self, state: Any, choices: tuple[str, ...] | None = None) -> str:
        out = self.agent.config.policy(ScriptedTurn(list(self.trace.messages), self.task, state, choices, self.rng))
        reply = await out if inspect.isawaitable(out) else out
        if not isinstance(reply, str):
            raise TypeError(f"scripted policy must return str, got {type(reply).__name__}")
        return reply

    async def _choose(self, params: SamplingParams, state: Any, choices: tuple[str, ...]) -> str:
        """A reply constrained to ``choices``, sampled token by token along their shared prefixes."""
        agent, trace = self.agent, self.trace
        options = agent.template.choice_ids(choices)
        if agent.backend is None:  # scripted: its reply must be one of the choices
            reply = await self._scripted_reply(state, choices)
            if reply not in options:
                raise ValueError(f"scripted policy replied {reply!r}, which is not one of the choices {list(choices)}")
            ids = options[reply]
            trace.append("action", ids, allowed=choice_steps(options, ids))
        else:
            ids, logprobs, allowed = [], [], []
            while (reply := next((c for c, o in options.items() if o == ids), None)) is None:
                candidates = _next_ids(options, ids)
                if len(candidates) == 1:  # forced: the only way to continue, probability 1 under the restriction
                    token, logprob = candidates[0], 0.0
                else:
                    gen = await agent.backend.generate(
                        trace.token_ids + ids,
                        params.with_overrides(max_new_tokens=1, stop=(), allowed_token_ids=tuple(candidates)),
                    )
                    token, logprob = gen.token_ids[0], gen.logprobs[0]
                ids.append(token)
                logprobs.append(logprob)
                allowed.append(candidates)
            trace.append("action", ids, logprobs, allowed=allowed, temperature=params.temperature)
        self._reply_ended_turn = bool(agent.template.eos_text) and ids[-1:] == [agent.tokenizer.eos_token_id]
        return reply


def _next_ids(options: dict[str, list[int]], prefix: list[int]) -> list[int]:
    """The token ids that continue ``prefix`` towards some option."""
    n = len(prefix)
    return sorted({o[n] for o in options.values() if len(o) > n and o[:n] == prefix})


def choice_steps(options: dict[str, list[int]], ids: list[int]) -> list[list[int]]:
    """Per token of the option ``ids``, the ids a constrained reply could pick at that step."""
    return [_next_ids(options, ids[:i]) for i in range(len(ids))]


# -- building agents ------------------------------------------------------------------------------

_BACKENDS: dict[str, GenerationBackend] = {}


def frozen_backend(model_id: str, device=None) -> GenerationBackend:
    """A process-wide cached backend for a frozen model, loaded once however many seats or teachers use it.

    The first call decides the device (default: CUDA when available, else CPU).
    """
    if model_id not in _BACKENDS:
        from .backends.transformers import TransformersBackend
        from .models import load_model_and_tokenizer

        model, tok = load_model_and_tokenizer(model_id, device=device)
        model.eval().requires_grad_(False)
        _BACKENDS[model_id] = TransformersBackend(model, tok, model_id=model_id)
    return _BACKENDS[model_id]


def make_agent(config: AgentConfig | dict, *, policy_backend: GenerationBackend | None = None, device=None) -> Agent:
    """Build an agent from its config (``device`` places a frozen model when it is first loaded).

    >>> agent = make_agent(AgentConfig(model="tiny", harness={"id": "chat"}))  # doctest: +SKIP
    """
    if isinstance(config, dict):
        config = AgentConfig(**config)
    if config.model == SCRIPTED:
        from .models import load_tokenizer

        tok = policy_backend.tokenizer if policy_backend is not None and config.tokenizer is None else None
        return Agent(config, None, tok or load_tokenizer(config.tokenizer or "tiny"))
    if config.model == POLICY:
        if policy_backend is None:
            raise ValueError("model='policy' binds a seat to the live policy, which only a trainer provides")
        return Agent(config, policy_backend)
    return Agent(config, frozen_backend(config.model, device))


@dataclass
class Seat:
    """An agent as one episode sees it: its role name, trainability, and where finished runs go.

    ``seed`` (a string, e.g. the run seed and the episode id) seeds each interaction's ``rng``, the
    random stream a scripted policy draws from, so an episode's scripted moves do not depend on
    which other episodes ran before it.
    """

    agent: Agent
    role: str
    trainable: bool
    sink: list[Trace] = field(default_factory=list)
    seed: str | None = None
    interactions: list[Interaction] = field(default_factory=list)

    @property
    def waiting(self) -> bool:
        """Whether this seat is producing a reply right now."""
        return any(it.waiting for it in self.interactions)

    def _stamp(self, trace: Trace) -> None:
        if not trace.segments and trace.error is None:
            return  # the seat was never asked to act (e.g. the other player forfeited first): no run to record
        trace.agent, trace.trainable = self.role, self.trainable
        self.sink.append(trace)

    def interaction(self, task: Task, **sampling_overrides) -> Interaction:
        rng = None if self.seed is None else random.Random(f"{self.seed}/{self.role}/{len(self.interactions)}")
        it = self.agent.interaction(task, rng=rng, **sampling_overrides)
        self.interactions.append(it)
        it.trace.agent = self.role
        it._on_close.append(self._stamp)
        return it

    async def run(self, task: Task, **sampling_overrides) -> Trace:
        async with self.interaction(task, **sampling_overrides) as it:
            await it.send()
        return it.trace
