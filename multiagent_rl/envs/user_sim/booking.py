"""A booking with three slots (city, date, seats): goals, what a message mentions, questions and actions.

The assistant's final structured action is one line, ``BOOK city=<city> date=<date> seats=<n>``; the success
check compares it with the user's hidden goal, slot by slot. A slot the assistant does not know is written
``any`` (and never matches).

```pycon
>>> goal = Goal("Oslo", "May 3", 2)
>>> booking_text(goal)
'BOOK city=Oslo date=May 3 seats=2'
>>> parse_booking("Sure. BOOK city=Oslo date=May 3 seats=2") == goal
True
>>> mentions("Not Rome: Oslo, on May 3.")["city"]
['Rome', 'Oslo']

```
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

CITIES = ("Paris", "Rome", "Oslo", "Lima", "Cairo", "Tokyo", "Quito", "Delhi")
DATES = ("May 3", "May 9", "June 2", "June 7", "July 4", "July 8")
SEATS = (1, 2, 3, 4)
SLOTS = ("city", "date", "seats")
UNKNOWN = "any"
QUESTIONS = {"city": "Which city?", "date": "Which date?", "seats": "How many seats?"}
"""The assistant's question for each slot (the menu's wording; a model may ask in its own words)."""
_ASKS = {"city": ("city", "where"), "date": ("date", "when", "day"), "seats": ("seat", "how many", "people")}
_NUMBER_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4}


@dataclass(frozen=True)
class Goal:
    """What the user wants booked (hidden from the assistant)."""

    city: str
    date: str
    seats: int

    def value(self, slot: str) -> str:
        return str(getattr(self, slot))


def all_goals() -> list[Goal]:
    return [Goal(c, d, s) for c in CITIES for d in DATES for s in SEATS]


def split_goals(held_out_share: float = 0.2, seed: int = 0) -> tuple[list[Goal], list[Goal]]:
    """A fixed split of every goal into training and held-out goals (no goal is in both)."""
    goals = all_goals()
    random.Random(seed).shuffle(goals)
    k = int(len(goals) * held_out_share)
    return goals[k:], goals[:k]


def booking_text(goal: Goal | dict) -> str:
    g = goal if isinstance(goal, dict) else {s: goal.value(s) for s in SLOTS}
    return f"BOOK city={g['city']} date={g['date']} seats={g['seats']}"


_BOOK = re.compile(r"BOOK city=(?P<city>[A-Za-z]+) date=(?P<date>[A-Za-z]+(?: \d+)?) seats=(?P<seats>\w+)")


def parse_booking(text: str) -> Goal | None:
    """The last ``BOOK ...`` action in ``text`` as a goal (None when there is none, or a slot is not a value)."""
    found = list(_BOOK.finditer(text))
    if not found:
        return None
    m = found[-1]
    if m["city"] not in CITIES or m["date"] not in DATES or not m["seats"].isdigit() or int(m["seats"]) not in SEATS:
        return None
    return Goal(m["city"], m["date"], int(m["seats"]))


_SLOT_VALUE = {"city": re.compile(r"\bcity=([A-Za-z]+)"), "date": re.compile(r"\bdate=([A-Za-z]+(?: \d+)?)"),
               "seats": re.compile(r"\bseats=(\d+)")}


def booked_slots(text: str) -> dict[str, str]:
    """Each slot of the last ``BOOK`` line in ``text`` that names a value, read on its own (a booking with one slot
    unreadable still books the others): what partial credit compares with the goal.

    ```pycon
    >>> booked_slots("BOOK city=Oslo date=any seats=2")
    {'city': 'Oslo', 'seats': '2'}

    ```
    """
    if "BOOK" not in text:
        return {}
    line = text[text.rindex("BOOK"):].split("\n", 1)[0]
    found = {}
    for slot, pattern in _SLOT_VALUE.items():
        m = pattern.search(line)
        if m and (m[1] in CITIES if slot == "city" else m[1] in DATES if slot == "date" else int(m[1]) in SEATS):
            found[slot] = m[1]
    return found


def wants_to_book(text: str) -> bool:
    """Whether ``text`` is a booking attempt (well-formed or not)."""
    return "BOOK" in text


def mentions(text: str) -> dict[str, list[str]]:
    """Every slot value ``text`` mentions, per slot, in order of appearance (repeats kept)."""
    found: dict[str, list[tuple[int, str]]] = {s: [] for s in SLOTS}
    for city in CITIES:
        found["city"] += [(m.start(), city) for m in re.finditer(rf"\b{city}\b", text)]
    for date in DATES:
        found["date"] += [(m.start(), date) for m in re.finditer(rf"\b{date}\b", text)]
    for m in re.finditer(r"\b(\d+|one|two|three|four) (?:seats?|people|tickets?)\b", text, re.IGNORECASE):
        n = _NUMBER_WORDS.get(m.group(1).lower()) or int(m.group(1))
        if n in SEATS:
            found["seats"].append((m.start(), str(n)))
    return {s: [v for _, v in sorted(found[s])] for s in SLOTS}


def asked_slots(text: str) -> list[str]:
    """The slots a message asks about (by keywords), in slot order."""
    lowered = text.lower()
    return [s for s in SLOTS if any(k in lowered for k in _ASKS[s])]


def latest_values(messages: list[str]) -> dict[str, str]:
    """Each slot's most recent mention across ``messages`` (the user's), or
    ``UNKNOWN``."""
    out = {s: UNKNOWN for s in SLOTS}
    for text in messages:
        for slot, values in mentions(text).items():
            if values:
                out[slot] = values[-1]
    return out


def menu(messages: list[str]) -> list[str]:
    """The assistant's choices after the user's ``messages``: the three questions, then a booking for every
    combination of values mentioned so far (``any`` for a slot never mentioned)."""
    seen = {s: [] for s in SLOTS}
    for text in messages:
        for slot, values in mentions(text).items():
            seen[slot] += [v for v in values if v not in seen[slot]]
    options = [seen[s] or [UNKNOWN] for s in SLOTS]
    books = [booking_text({"city": c, "date": d, "seats": n}) for c in options[0] for d in options[1] for n in options[2]]
    return [QUESTIONS[s] for s in SLOTS] + books
