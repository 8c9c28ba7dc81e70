"""Agents: a harness × a model × sampling settings.

``await agent.run(task)`` plays one single-turn chat and returns a [`Trace`][multiagent_rl.episodes.trace.Trace];
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
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from pydantic import BaseModel, ConfigDict, Field

from ..backends import GenerationBackend, SamplingParams, build_backend
from ..backends.endpoint_errors import EndpointError
from ..episodes.trace import Trace
from ..tasks.task import Task
from ..tools import Tool, as_tools, parse_tool_calls, run_tool_call
from .chat_template import ChatTemplate, check_encodable, choice_steps, next_ids
from .harness import ChatHarnessConfig, HarnessConfig, ToolHarnessConfig

SCRIPTED = "scripted"


class AgentConfig(BaseModel):
    """How to build one agent.

    ``model`` is ``"tiny"`` (embedded), a hub id or a local path (a frozen model), ``"policy"``
    (bound to the live policy by the trainer) or ``"scripted"`` (then ``policy`` is the function).
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    model: str = "tiny"
    harness: HarnessConfig = Field(default_factory=ChatHarnessConfig)
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
    tools: tuple[str, ...] = ()
    """Names of the tools this interaction may call (results arrive as ``{"role": "tool"}`` messages)."""
    rng: random.Random = field(default_factory=random.Random)
    """This seat's random stream for the episode. Under a trainer it is seeded from the run's seed, the
    episode id and the role, so scripted randomness is reproducible and resumes exactly; draw from it
    instead of keeping a generator of your own."""


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

    def interaction(self, task: Task, rng: random.Random | None = None,
                    tools: Sequence[Callable[..., Any] | Tool] | None = None, **sampling_overrides) -> Interaction:
        """Turn-by-turn control: ``reply = await it.send(user_text)``; ``it.trace`` is the run so far.

        ``rng`` is handed to a scripted policy as ``turn.rng`` (default: a fresh unseeded generator).
        ``tools`` (functions or [`Tool`][multiagent_rl.tools.Tool] s) need the ``tools`` harness.
        Sampling: the agent's settings, then the task's ``sampling`` overrides, then ``sampling_overrides``.
        """
        sampling = self.config.sampling.with_overrides(**{**(task.sampling or {}), **sampling_overrides})
        return Interaction(self, task, sampling, rng, tools)

    async def run(self, task: Task, **sampling_overrides) -> Trace:
        """Single-turn chat on the task's prompt: one reply, one trace."""
        return await single_turn(self.interaction(task, **sampling_overrides))


class Interaction:
    """A conversation between the environment (as the user) and one agent."""

    def __init__(self, agent: Agent, task: Task, sampling: SamplingParams, rng: random.Random | None = None,
                 tools: Sequence[Callable[..., Any] | Tool] | None = None):
        self.tools = as_tools(tools)
        if self.tools:
            if not isinstance(agent.config.harness, ToolHarnessConfig):
                raise ValueError(f"this agent was given tools {sorted(self.tools)} but its harness is "
                                 f"{agent.config.harness.id!r}; give the seat harness = {{id = 'tools'}}")
            if getattr(agent.backend, "text_only", False):
                raise ValueError(f"{agent.model_id!r} is a text-only chat endpoint, which the tool harness cannot "
                                 "drive token by token; serve the model with vLLM (kind = 'vllm') for a tool seat")
        self.agent = agent
        self.task = task
        self.sampling = sampling
        self.rng = rng if rng is not None else random.Random()
        self.trace = Trace(model=agent.model_id, policy=getattr(agent.backend, "policy_name", None))
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
            raise TurnLimitReached(f"{trace.role}: max_turns={agent.config.harness.max_turns} reached")
        if text is not None:
            check_encodable(text)
        if not trace.segments:
            system = self.task.data.system_prompt or agent.config.harness.system_prompt
            if system:
                trace.messages.append({"role": "system", "content": system})
            trace.messages.append({"role": "user", "content": self.task.data.prompt if text is None else text})
            schemas = [t.schema for t in self.tools.values()] or None
            trace.append("prompt", agent.template.prompt_ids(trace.messages, tools=schemas))
        else:
            if text is None:
                raise ValueError("send() after the first turn needs the user's text")
            trace.messages.append({"role": "user", "content": text})
            trace.append("observation", agent.template.user_turn_ids(text, self._reply_ended_turn))
        params = self.sampling.with_overrides(**sampling_overrides)
        reply_coro = self._reply(params, state) if choices is None else self._choose(params, state, tuple(choices))
        reply = await self._timed(reply_coro)
        self.turns += 1
        self._record_reply(reply)
        if self.tools and choices is None:
            reply = await self._use_tools(reply, params, state)
        return reply

    def _record_reply(self, reply: str) -> None:
        self.trace.messages.append({"role": "assistant", "content": reply})
        self.trace.last_reply = reply

    async def _timed(self, reply_coro) -> str:
        self.waiting = True  # stays True if the episode is cancelled meanwhile: its timeout names this seat
        try:
            reply = await asyncio.wait_for(reply_coro, timeout=self.agent.config.timeout)
        except asyncio.TimeoutError:
            self.waiting = False
            raise ReplyTimeout(
                f"role {self.trace.role!r} ({self.agent.model_id}): no reply within {self.agent.config.timeout:g} s "
                "(the per-reply timeout: `timeout` of the role's config)"
            ) from None
        self.waiting = False
        return reply

    async def _use_tools(self, reply: str, params: SamplingParams, state: Any) -> str:
        """Run the reply's tool calls, append their results, let the model go on; until a reply calls none."""
        harness, trace = self.agent.config.harness, self.trace
        rounds = 0
        while calls := parse_tool_calls(reply):
            if rounds == harness.max_tool_rounds:
                trace.info["tool_rounds_exhausted"] = trace.info.get("tool_rounds_exhausted", 0) + 1
                break
            rounds += 1
            results = []
            for i, call in enumerate(calls):
                if i < harness.max_tool_calls_per_reply:
                    content, record = await run_tool_call(self.tools, call, harness.max_result_chars)
                else:
                    content = (f"Error: at most {harness.max_tool_calls_per_reply} tool calls are run per reply; "
                               "this one was not")
                    record = {"name": call.name, "arguments": call.arguments, "ok": False, "error": content}
                results.append({"role": "tool", "name": call.name or "invalid", "content": content})
                trace.info.setdefault("tool_calls", []).append({**record, "turn": self.turns})
            trace.messages.extend(results)
            trace.append("observation", self.agent.template.turn_ids(results, self._reply_ended_turn))
            reply = await self._timed(self._reply(params, state))
            self._record_reply(reply)
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
            self._reply_ended_turn = agent.template.ends_turn(ids)
            return tok.decode(ids, skip_special_tokens=True)
        gen = await self._generate(trace.token_ids, params)
        trace.append("action", gen.token_ids, gen.logprobs, temperature=params.temperature)
        trace.token_exact = trace.token_exact and gen.exact
        self._reply_ended_turn = agent.template.ends_turn(gen.token_ids)
        text = tok.decode(gen.token_ids, skip_special_tokens=True)
        for s in params.stop:
            if s in text:
                text = text[: text.index(s)]
        return text

    async def _generate(self, token_ids: list[int], params: SamplingParams):
        try:
            return await self.agent.backend.generate(token_ids, params, self.trace.messages)
        except EndpointError as exc:  # a served model's error says which seat was waiting for it
            raise EndpointError(f"seat {self.trace.role!r}: {exc}") from None

    async def _scripted_reply(self, state: Any, choices: tuple[str, ...] | None = None) -> str:
        turn = ScriptedTurn(list(self.trace.messages), self.task, state, choices, tuple(self.tools), self.rng)
        out = self.agent.config.policy(turn)
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
            if not agent.backend.supports_choices:
                raise ValueError(f"the backend of {agent.model_id!r} cannot constrain replies to choices; "
                                 "use a backend that honours allowed_token_ids (transformers, vLLM)")
            ids, logprobs, allowed = [], [], []
            while (reply := next((c for c, o in options.items() if o == ids), None)) is None:
                candidates = next_ids(options, ids)
                if len(candidates) == 1:  # forced: the only way to continue, probability 1 under the restriction
                    token, logprob = candidates[0], 0.0
                else:
                    gen = await self._generate(
                        trace.token_ids + ids,
                        params.with_overrides(max_new_tokens=1, stop=(), allowed_token_ids=tuple(candidates)),
                    )
                    token, logprob = gen.token_ids[0], gen.logprobs[0]
                ids.append(token)
                logprobs.append(logprob)
                allowed.append(candidates)
            trace.append("action", ids, logprobs, allowed=allowed, temperature=params.temperature)
        self._reply_ended_turn = agent.template.ends_turn(ids)
        return reply


async def single_turn(interaction: Interaction) -> Trace:
    """Play one turn on the task's prompt and close the interaction: the trace of a single-turn run."""
    async with interaction as it:
        await it.send()
    return it.trace


def make_agent(config: AgentConfig | dict, *, policy_backend: GenerationBackend | None = None, device=None,
               endpoints: dict | None = None) -> Agent:
    """Build an agent from its config: its backend from ``config.model``
    ([`build_backend`][multiagent_rl.backends.build_backend]; ``device`` places a frozen model when it is first loaded),
    or a scripted one.

    ```pycon
    >>> agent = make_agent(AgentConfig(model="tiny", harness={"id": "chat"}))  # doctest: +SKIP

    ```
    """
    if isinstance(config, dict):
        config = AgentConfig(**config)
    if config.model == SCRIPTED:
        from ..models import load_tokenizer

        tok = policy_backend.tokenizer if policy_backend is not None and config.tokenizer is None else None
        return Agent(config, None, tok or load_tokenizer(config.tokenizer or "tiny"))
    return Agent(config, build_backend(config.model, device=device, policy=policy_backend, endpoints=endpoints))


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
        trace.role, trace.trainable = self.role, self.trainable
        self.sink.append(trace)

    def interaction(self, task: Task, tools: Sequence[Callable[..., Any] | Tool] | None = None,
                    **sampling_overrides) -> Interaction:
        """Turn-by-turn control of this seat (see [`Agent.interaction`][multiagent_rl.agents.agent.Agent.interaction]),
        recorded into the episode."""
        rng = None if self.seed is None else random.Random(f"{self.seed}/{self.role}/{len(self.interactions)}")
        it = self.agent.interaction(task, rng=rng, tools=tools, **sampling_overrides)
        self.interactions.append(it)
        it.trace.role = self.role
        it._on_close.append(self._stamp)
        return it

    async def run(self, task: Task, **sampling_overrides) -> Trace:
        """Single-turn chat on the task's prompt, recorded into the episode."""
        return await single_turn(self.interaction(task, **sampling_overrides))
