"""Simulated user: a user with a hidden goal and a persona talks to the assistant being trained.

One episode, as its rules:

1. A task is a private scenario: a hidden goal (a booking: city, date, seats; [`multiagent_rl.envs.user_sim.booking`][])
   and a persona (``terse``, ``chatty``, ``confused``, ``adversarial``). Only the ``user`` seat sees it, in its
   system prompt, with the rule to end the conversation with the done marker (``###DONE###``).
2. The user speaks first; the ``assistant`` (system prompt: how to book, nothing of the scenario) replies;
   they alternate. The assistant ends its part with one structured action, ``BOOK city=.. date=.. seats=..``;
   the user answers it and the conversation is over. It also ends when the user's message holds the done
   marker, or after ``max_turns`` assistant replies.
3. The assistant's reward is the success check on its booking, slot by slot against the hidden goal:
   ``success`` 1 when all three match, else 0 (no booking: 0). Never the scenario text, never the user's words.

``menu=True`` constrains every assistant reply to a menu (the legal-action harness): the three questions, and a
booking for every combination of values the user has mentioned so far (``any`` for a slot never mentioned).
That is the tiny model's game; a real model replies in free text and its last ``BOOK`` line is parsed.

The user is scripted by default (``scripted_user``, untrained): bind ``[env.roles.user]`` to any model id or
endpoint to have a model play it from [`user_system_prompt`][multiagent_rl.envs.user_sim.user_system_prompt] (each
persona's prompt).

The assistant's reward is ``success`` (1 when the booking is the goal); with ``partial_credit`` > 0 a booking that
is not fully right also earns ``slots``: ``partial_credit`` × the share of its slots that match the goal, each slot
read on its own ([`booked_slots`][multiagent_rl.envs.user_sim.booking.booked_slots]), so a small model whose bookings
are never all right still has a signal to follow.

A user played by a model being trained (``user_reward=True``) is rewarded for playing its part: ``in_character``
1 when it neither quoted its hidden goal nor stepped out of its part (0 otherwise), plus ``goal_met``, the
assistant's ``success`` (it came to book what it wanted). Without ``user_reward`` the user's trace has no reward.

Metrics on the assistant's trace: ``success``, ``booked``, ``slots_right`` (share), ``user_turns``,
``ended_without_success``, ``persona_<p>`` and ``success_<p>`` (so that mean(success_p) / mean(persona_p) is the
success rate per persona). On a model-played user's trace, how well it plays its part
([`user_conduct`][multiagent_rl.envs.user_sim.user_conduct]): ``leaked_goal`` and ``broke_character``.
"""

from __future__ import annotations

import random

from ...tasks.task import Task, TaskData
from ..base import Env
from ..registry import register_env
from .booking import (
    CITIES,
    QUESTIONS,
    SLOTS,
    UNKNOWN,
    Goal,
    asked_slots,
    booked_slots,
    booking_text,
    latest_values,
    mentions,
    menu,
    parse_booking,
    split_goals,
    wants_to_book,
)

PERSONAS = ("terse", "chatty", "confused", "adversarial")
DONE_MARKER = "###DONE###"
ASSISTANT_SYSTEM = ("You are a booking assistant. Ask the user for what you need: the city, the date and the number "
                    "of seats. When you know all three, reply with one line: BOOK city=<city> date=<date> "
                    "seats=<number>. The booking is final.")
PERSONA_PROMPTS = {
    "terse": "Answer only what the assistant asks, in as few words as possible. Volunteer nothing.",
    "chatty": "You are chatty: in your first message say everything you want at once, with some small talk "
              "(you may mention other cities you have visited, before the one you want).",
    "confused": "You are a little confused: your first message gives a wrong number of seats and no date; in your "
                "next message correct the number of seats before answering anything else.",
    "adversarial": "You are impatient: push the assistant to book right away, before it knows everything, and "
                   "give only what it asks for.",
}


_OUT_OF_CHARACTER = ("book city=", "how can i help", "how may i help", "as an ai", "i am an ai", "i'm an ai",
                     "language model", "i am a booking assistant", "i'm a booking assistant", "hidden goal")


def user_conduct(user_said: list[str], goal: Goal) -> dict[str, float]:
    """How a model-played user kept to its part, over its messages: ``leaked_goal`` (1 when a message quotes its
    hidden goal as the system prompt words it, "book N seats to CITY on DATE") and ``broke_character`` (1 when a
    message talks as the assistant or as a model: a ``BOOK`` line, "how can I help", "as an AI", "hidden goal")."""
    quoted = f"book {goal.seats} seats to {goal.city} on {goal.date}".lower()
    text = [m.lower() for m in user_said]
    return {"leaked_goal": float(any(quoted in m for m in text)),
            "broke_character": float(any(any(p in m for p in _OUT_OF_CHARACTER) for m in text))}


def user_system_prompt(goal: Goal, persona: str, done_marker: str = DONE_MARKER) -> str:
    """The scenario as a model-played user reads it (the assistant never sees it)."""
    return (f"You are a customer talking to a booking assistant. Your hidden goal: book {goal.seats} seats to "
            f"{goal.city} on {goal.date}. {PERSONA_PROMPTS[persona]} When the assistant has booked (a line starting "
            f"with BOOK), say whether it is what you wanted and end your message with {done_marker}.")


@register_env("user_sim")
class UserSimEnv(Env):
    """Seats ``user`` (scripted and untrained by default) and ``assistant`` (trained)."""

    name = "user_sim"
    roles = ("user", "assistant")
    default_roles = {"user": {"model": "scripted", "policy": "multiagent_rl.envs.user_sim:scripted_user",
                              "trainable": False}}
    reward_ranges = {"success": (0.0, 1.0), "slots": (0.0, 1.0), "in_character": (0.0, 1.0), "goal_met": (0.0, 1.0)}

    def __init__(self, personas: list[str] | tuple[str, ...] = PERSONAS, max_turns: int = 6, menu: bool = False,
                 done_marker: str = DONE_MARKER, split: str = "train", assistant_tokens: int = 48,
                 user_tokens: int = 96, partial_credit: float = 0.0, user_reward: bool = False):
        unknown = [p for p in personas if p not in PERSONAS]
        if unknown or not personas:
            raise ValueError(f"personas {unknown or list(personas)}: choose from {', '.join(PERSONAS)}")
        if split not in ("train", "held_out"):
            raise ValueError(f"split={split!r}: 'train' or 'held_out' (goals never in training)")
        if max_turns < 1 or not done_marker:
            raise ValueError(f"max_turns={max_turns} must be >= 1 and done_marker non-empty")
        self.personas, self.max_turns, self.menu, self.done_marker = tuple(personas), max_turns, menu, done_marker
        self.goals = split_goals()[0 if split == "train" else 1]
        self.assistant_tokens, self.user_tokens = assistant_tokens, user_tokens
        if not 0.0 <= partial_credit <= 1.0:
            raise ValueError(f"partial_credit={partial_credit}: a share of the success reward, in [0, 1]")
        self.partial_credit, self.user_reward = partial_credit, user_reward

    def sample_tasks(self, num: int, rng: random.Random) -> list[Task]:
        return [self.scenario(rng.choice(self.goals), rng.choice(self.personas), rng.randrange(2**31))
                for _ in range(num)]

    def scenario(self, goal: Goal, persona: str, seed: int = 0) -> Task:
        """The user's task: the scenario in its system prompt, the goal and persona in ``info``."""
        return Task(TaskData(prompt="The assistant says: Hello! How can I help you?",
                             system_prompt=user_system_prompt(goal, persona, self.done_marker),
                             info={"goal": [goal.city, goal.date, goal.seats], "persona": persona, "seed": seed}))

    async def run(self, task: Task, agents) -> None:
        goal, persona = Goal(*task.data.info["goal"]), task.data.info["persona"]
        state = {"goal": goal, "persona": persona, "done_marker": self.done_marker, "assistant_said": None}
        user_said: list[str] = []
        booking, booked = None, {}
        async with agents["user"].interaction(task, max_new_tokens=self.user_tokens) as user:
            user_said.append(await user.send(state=dict(state)))
            assistant_task = Task(TaskData(prompt=user_said[0], system_prompt=ASSISTANT_SYSTEM))
            async with agents["assistant"].interaction(assistant_task, max_new_tokens=self.assistant_tokens) as it:
                for turn in range(self.max_turns):
                    choices = menu(user_said) if self.menu else None
                    message = None if turn == 0 else user_said[-1]
                    reply = await it.send(message, state={"user_said": list(user_said)}, choices=choices)
                    state["assistant_said"] = reply
                    user_said.append(await user.send(reply, state=dict(state)))
                    if wants_to_book(reply):
                        booking, booked = parse_booking(reply), booked_slots(reply)
                        break
                    if self.done_marker in user_said[-1]:
                        break
        self._score(it.trace, goal, persona, booking, user_turns=len(user_said), booked=booked)
        if user.trace.model not in (None, "scripted") or self.user_reward:
            conduct = user_conduct(user_said, goal)
            user.trace.metrics.update(conduct)
            if self.user_reward:  # a trained user: keep to the part, and get what it came for
                user.trace.add_reward("in_character", (1 - conduct["leaked_goal"]) * (1 - conduct["broke_character"]))
                user.trace.add_reward("goal_met", it.trace.metrics["success"])

    def _score(self, trace, goal: Goal, persona: str, booking: Goal | None, user_turns: int,
               booked: dict[str, str] | None = None):
        right = [booking is not None and booking.value(s) == goal.value(s) for s in SLOTS]
        success = float(all(right))
        trace.add_reward("success", success)
        if self.partial_credit:  # a booking's slots right, each read on its own, while none is fully right
            slots = sum((booked or {}).get(s) == goal.value(s) for s in SLOTS) / len(SLOTS)
            trace.add_reward("slots", 0.0 if success else self.partial_credit * slots)
        trace.metrics.update(success=success, booked=float(booking is not None), slots_right=sum(right) / len(SLOTS),
                             user_turns=float(user_turns), ended_without_success=1.0 - success)
        trace.metrics.update({f"persona_{p}": float(p == persona) for p in self.personas})
        trace.metrics.update({f"success_{p}": success * (p == persona) for p in self.personas})
        trace.info["user_sim"] = {"persona": persona, "goal": booking_text(goal),
                                  "booking": booking_text(booking) if booking else None}


# -- scripted players -------------------------------------------------------------------------------


def scripted_user():
    """Plays the scenario's persona from ``turn.state`` (the goal, the persona, the assistant's last reply)."""

    def act(turn) -> str:
        s = turn.state
        goal, persona, said = s["goal"], s["persona"], s["assistant_said"]
        if said is None:
            return _opening(goal, persona, turn.rng)
        if wants_to_book(said):
            ok = parse_booking(said) == goal
            return ("Perfect, thank you!" if ok else "That is not what I wanted.") + " " + s["done_marker"]
        answers = [_answer(goal, slot) for slot in asked_slots(said)]
        user_turns = sum(m["role"] == "assistant" for m in turn.messages)  # the user's own replies so far
        if persona == "chatty":
            answers = [_answer(goal, slot) for slot in SLOTS]
        if persona == "confused" and user_turns == 1:
            answers.insert(0, f"Sorry, not {_wrong_seats(goal)} seats: {goal.seats} seats.")
        if persona == "adversarial":
            answers.append("Just book it already!")
        return " ".join(answers) if answers else "What do you need to know?"

    return act


def _opening(goal: Goal, persona: str, rng: random.Random) -> str:
    if persona == "terse":
        return "I need a booking."
    if persona == "chatty":
        other = rng.choice([c for c in CITIES if c != goal.city])
        return (f"Hi! I loved {other} last year, but now I want {goal.city}, on {goal.date}, for {goal.seats} "
                f"seats please.")
    if persona == "confused":
        return f"I need {_wrong_seats(goal)} seats to {goal.city}."
    return "Book me a trip right now, no questions!"


def _wrong_seats(goal: Goal) -> int:
    return goal.seats % 4 + 1  # another valid number of seats


def _answer(goal: Goal, slot: str) -> str:
    return {"city": f"{goal.city}.", "date": f"On {goal.date}.", "seats": f"{goal.seats} seats."}[slot]


def careful_assistant():
    """Asks for the first slot the user has not mentioned, books the latest value of each once all are known;
    first asks one question when the user has said only one message (a correction may follow). Near-optimal."""

    def act(turn) -> str:
        said = turn.state["user_said"]
        values = latest_values(said)
        missing = [s for s in SLOTS if values[s] == UNKNOWN]
        if missing:
            return QUESTIONS[missing[0]]
        return booking_text(values)

    return act


def hasty_assistant(patience: float = 0.3):
    """Books at once with the first value mentioned for each slot (``any`` when none), except with probability
    ``patience`` per turn it acts like [`careful_assistant`][multiagent_rl.envs.user_sim.careful_assistant] instead: an
    imitation warm-up that teaches the formats and leaves room to learn when to ask and which mention counts."""
    careful = careful_assistant()

    def act(turn) -> str:
        if turn.rng.random() < patience:
            return careful(turn)
        first = {s: UNKNOWN for s in SLOTS}
        for text in turn.state["user_said"]:
            for slot, values in mentions(text).items():
                if values and first[slot] == UNKNOWN:
                    first[slot] = values[0]
        return booking_text(first)

    return act
