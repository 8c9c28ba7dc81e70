"""Small Python function tasks with labelled unit tests and labelled candidates, for an agentic judge.

Each :class:`CodeTask` is an everyday function (clamp, run-length encoding, Roman numerals, ...) given by a
short spec and a few examples. The examples are part of the spec and are authoritative: the spec and its
examples decide what is correct, never the tests. A solver picks or writes an implementation, the unit tests
give a task reward, and a judge that reads the spec and runs code may overrule the tests.

The tests are not all trustworthy. In the *tricky* tasks (:attr:`CodeTask.tricky`) exactly one test is
labelled ``"wrong"`` (its expected value contradicts the spec) or ``"overspecified"`` (it demands something the
spec leaves free: a return type, an exception type, key order, behaviour on an input the spec does not
cover). Each tricky task also has an incorrect candidate written to fit that test: it passes every test of the
task yet fails an example, the case where unit tests alone reward a wrong solution and only a judge that
checks the spec can catch it.

Everything carries ground truth: :attr:`CodeTest.label` for tests, :attr:`Candidate.correct` for candidates
(correct means it meets the spec and examples, whatever the tests say). :func:`run_tests_locally` and
:func:`check_examples_locally` execute the built-in code in this process to verify those labels; they are for
this trusted set only, never for model-written code.

>>> task = code_task("clamp")
>>> task.examples[0]
('clamp(5, 0, 3)', '3')
>>> [c.correct for c in task.candidates]
[False, True, False, True]
>>> all(run_tests_locally(task, task.candidates[1].source).values())
True
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass
from typing import Literal

TestLabel = Literal["valid", "wrong", "overspecified"]
"""A test's ground truth: ``valid`` agrees with the spec; ``wrong`` contradicts it; ``overspecified`` demands
behaviour the spec leaves free."""


@dataclass(frozen=True)
class CodeTest:
    """One unit test: a single ``def test_...():`` using plain ``assert``, calling the task's function by name."""

    name: str
    source: str
    label: TestLabel
    why: str = ""  # for a wrong / overspecified test: what is wrong with it; empty for a valid one


@dataclass(frozen=True)
class Candidate:
    """One implementation of the task's function, with ground truth against the spec (not the tests)."""

    source: str
    correct: bool
    note: str


@dataclass(frozen=True)
class CodeTask:
    """A function to write: its spec and authoritative examples, unit tests, and candidate implementations."""

    id: str
    function: str
    spec: str
    examples: tuple[tuple[str, str], ...]  # (call expression, expected value as a Python literal)
    tests: tuple[CodeTest, ...]
    candidates: tuple[Candidate, ...]

    @property
    def tricky(self) -> bool:
        """True when some test is not ``"valid"``, so the tests alone can mislead."""
        return any(t.label != "valid" for t in self.tests)

    def test_source(self) -> str:
        """All the tests' sources, ready to append after the solution code in one module."""
        return "\n\n".join(t.source for t in self.tests)


def _code(text: str) -> str:
    return textwrap.dedent(text).strip() + "\n"


def _test(source: str, label: TestLabel = "valid", why: str = "") -> CodeTest:
    # The name is read from the source so that the two can never disagree.
    source = _code(source)
    match = re.match(r"def (test_\w+)\(", source)
    if match is None:
        raise ValueError(f"not a test function: {source!r}")
    return CodeTest(match.group(1), source, label, why)


def _wrong(source: str, why: str) -> CodeTest:
    return _test(source, "wrong", why)


def _over(source: str, why: str) -> CodeTest:
    return _test(source, "overspecified", why)


def _cand(source: str, correct: bool, note: str) -> Candidate:
    return Candidate(_code(source), correct, note)


_CLAMP = CodeTask(
    id="clamp",
    function="clamp",
    spec=(
        "clamp(x, low, high) -> number\n"
        "Return x limited to the closed interval [low, high]: low if x < low, high if x > high, otherwise x "
        "itself. Callers guarantee low <= high."
    ),
    examples=(("clamp(5, 0, 3)", "3"), ("clamp(-2, 0, 3)", "0"), ("clamp(2, 0, 3)", "2"), ("clamp(0, 0, 3)", "0")),
    tests=(
        _test("""
            def test_inside():
                assert clamp(1.5, 0, 3) == 1.5
        """),
        _test("""
            def test_above():
                assert clamp(10, -1, 1) == 1
        """),
        _test("""
            def test_below():
                assert clamp(-10, -1, 1) == -1
        """),
        _test("""
            def test_on_the_bounds():
                assert clamp(3, 0, 3) == 3
                assert clamp(0, 0, 3) == 0
        """),
    ),
    candidates=(
        _cand("""
            def clamp(x, low, high):
                return max(min(x, low), high)
        """, False, "min and max swapped: always returns high"),
        _cand("""
            def clamp(x, low, high):
                return min(max(x, low), high)
        """, True, "correct: min of max"),
        _cand("""
            def clamp(x, low, high):
                return max(x, low)
        """, False, "forgets the upper bound"),
        _cand("""
            def clamp(x, low, high):
                if x < low:
                    return low
                if x > high:
                    return high
                return x
        """, True, "correct: explicit comparisons"),
    ),
)

_IS_PALINDROME = CodeTask(
    id="is_palindrome",
    function="is_palindrome",
    spec=(
        "is_palindrome(s: str) -> bool\n"
        "True when s reads the same forwards and backwards after lowercasing it and dropping every character "
        "that is not a letter or digit (str.isalnum). The empty string is a palindrome."
    ),
    examples=(
        ("is_palindrome('A man, a plan, a canal: Panama')", "True"),
        ("is_palindrome('No lemon, no melon')", "True"),
        ("is_palindrome('hello')", "False"),
        ("is_palindrome('')", "True"),
    ),
    tests=(
        _test("""
            def test_simple_words():
                assert is_palindrome("racecar")
                assert not is_palindrome("racecars")
        """),
        _test("""
            def test_mixed_case():
                assert is_palindrome("Abba")
        """),
        _wrong("""
            def test_spaces_count():
                assert not is_palindrome("Race car")
        """, "Dropping the space leaves 'racecar', a palindrome, so the spec requires True."),
        _test("""
            def test_digits():
                assert is_palindrome("12321")
                assert not is_palindrome("123")
        """),
        _test("""
            def test_empty():
                assert is_palindrome("")
        """),
    ),
    candidates=(
        _cand("""
            def is_palindrome(s):
                kept = "".join(c for c in s if c.isalnum())
                return kept == kept[::-1]
        """, False, "drops punctuation but forgets to lowercase"),
        _cand("""
            def is_palindrome(s):
                lowered = s.lower()
                return lowered == lowered[::-1]
        """, False, "lowercases but keeps spaces and punctuation (fits the wrong test)"),
        _cand("""
            def is_palindrome(s):
                kept = [c.lower() for c in s if c.isalnum()]
                return kept == kept[::-1]
        """, True, "correct"),
    ),
)

_FIZZBUZZ = CodeTask(
    id="fizzbuzz",
    function="fizzbuzz",
    spec=(
        "fizzbuzz(n: int) -> str\n"
        "For n >= 1: 'FizzBuzz' if n is divisible by 15, else 'Fizz' if it is divisible by 3, else 'Buzz' if it "
        "is divisible by 5, else the decimal string str(n)."
    ),
    examples=(("fizzbuzz(3)", "'Fizz'"), ("fizzbuzz(10)", "'Buzz'"), ("fizzbuzz(30)", "'FizzBuzz'"),
              ("fizzbuzz(7)", "'7'")),
    tests=(
        _test("""
            def test_fizz():
                assert fizzbuzz(9) == "Fizz"
        """),
        _test("""
            def test_buzz():
                assert fizzbuzz(25) == "Buzz"
        """),
        _test("""
            def test_fizzbuzz():
                assert fizzbuzz(15) == "FizzBuzz"
        """),
        _test("""
            def test_plain_number():
                assert fizzbuzz(1) == "1"
                assert fizzbuzz(98) == "98"
        """),
    ),
    candidates=(
        _cand("""
            def fizzbuzz(n):
                if n % 3 == 0:
                    return "Fizz"
                if n % 5 == 0:
                    return "Buzz"
                if n % 15 == 0:
                    return "FizzBuzz"
                return str(n)
        """, False, "tests 3 before 15, so multiples of 15 give 'Fizz'"),
        _cand("""
            def fizzbuzz(n):
                if n % 3 == 0 or n % 5 == 0:
                    return "FizzBuzz"
                return str(n)
        """, False, "'FizzBuzz' for any multiple of 3 or 5"),
        _cand("""
            def fizzbuzz(n):
                if n % 15 == 0:
                    return "FizzBuzz"
                if n % 3 == 0:
                    return "Fizz"
                if n % 5 == 0:
                    return "Buzz"
                return n
        """, False, "returns the int itself instead of its string"),
        _cand("""
            def fizzbuzz(n):
                if n % 15 == 0:
                    return "FizzBuzz"
                if n % 3 == 0:
                    return "Fizz"
                if n % 5 == 0:
                    return "Buzz"
                return str(n)
        """, True, "correct"),
    ),
)

_COUNT_VOWELS = CodeTask(
    id="count_vowels",
    function="count_vowels",
    spec=(
        "count_vowels(s: str) -> int\n"
        "The number of characters of s that are one of a, e, i, o, u, in either case. 'y' is never a vowel."
    ),
    examples=(("count_vowels('hello')", "2"), ("count_vowels('AEIOU xyz')", "5"), ("count_vowels('Yay')", "1"),
              ("count_vowels('')", "0")),
    tests=(
        _test("""
            def test_lowercase():
                assert count_vowels("banana") == 3
        """),
        _wrong("""
            def test_y_counts():
                assert count_vowels("rhythm") == 1
        """, "The spec says 'y' is never a vowel, so 'rhythm' has 0 vowels, not 1."),
        _test("""
            def test_uppercase():
                assert count_vowels("EDUCATION") == 5
        """),
        _test("""
            def test_no_vowels():
                assert count_vowels("bcdfg") == 0
        """),
    ),
    candidates=(
        _cand("""
            def count_vowels(s):
                return sum(1 for c in s.lower() if c in "aeiou")
        """, True, "correct"),
        _cand("""
            def count_vowels(s):
                return sum(1 for c in s if c in "aeiou")
        """, False, "case-sensitive: misses uppercase vowels"),
        _cand("""
            def count_vowels(s):
                return sum(1 for c in s.lower() if c in "aeiouy")
        """, False, "counts 'y' as a vowel (fits the wrong test)"),
    ),
)

_GCD = CodeTask(
    id="gcd",
    function="gcd",
    spec=(
        "gcd(a: int, b: int) -> int\n"
        "The greatest common divisor of two non-negative integers, with gcd(n, 0) == gcd(0, n) == n "
        "(so gcd(0, 0) == 0)."
    ),
    examples=(("gcd(12, 18)", "6"), ("gcd(17, 5)", "1"), ("gcd(0, 9)", "9"), ("gcd(0, 0)", "0")),
    tests=(
        _test("""
            def test_common_factor():
                assert gcd(48, 36) == 12
        """),
        _test("""
            def test_coprime():
                assert gcd(35, 64) == 1
        """),
        _test("""
            def test_zero():
                assert gcd(7, 0) == 7
                assert gcd(0, 0) == 0
        """),
        _test("""
            def test_equal():
                assert gcd(21, 21) == 21
        """),
    ),
    candidates=(
        _cand("""
            def gcd(a, b):
                for d in range(min(a, b), 0, -1):
                    if a % d == 0 and b % d == 0:
                        return d
                return 1
        """, False, "searches down from min(a, b), so a zero argument gives 1"),
        _cand("""
            def gcd(a, b):
                import math
                return a * b // math.gcd(a, b)
        """, False, "computes the least common multiple"),
        _cand("""
            def gcd(a, b):
                while b:
                    a, b = b, a % b
                return a
        """, True, "correct: Euclid's algorithm"),
    ),
)

_ROTATE = CodeTask(
    id="rotate",
    function="rotate",
    spec=(
        "rotate(xs: list, k: int) -> list\n"
        "Return a new list with the elements of xs rotated k places to the right: the last k elements move to "
        "the front. k >= 0 and may exceed len(xs); an empty list stays empty."
    ),
    examples=(
        ("rotate([1, 2, 3], 1)", "[3, 1, 2]"),
        ("rotate([1, 2, 3, 4, 5], 2)", "[4, 5, 1, 2, 3]"),
        ("rotate([1, 2, 3], 4)", "[3, 1, 2]"),
        ("rotate([], 3)", "[]"),
    ),
    tests=(
        _test("""
            def test_half_turn():
                assert rotate([1, 2, 3, 4], 2) == [3, 4, 1, 2]
        """),
        _test("""
            def test_full_turn():
                assert rotate(["a", "b", "c"], 3) == ["a", "b", "c"]
        """),
        _wrong("""
            def test_rotate_by_one():
                assert rotate([1, 2, 3, 4], 1) == [2, 3, 4, 1]
        """, "That is a rotation to the left; rotating right by 1 gives [4, 1, 2, 3]."),
        _test("""
            def test_k_larger_than_length():
                assert rotate([1, 2, 3, 4], 6) == [3, 4, 1, 2]
        """),
        _test("""
            def test_empty_and_zero():
                assert rotate([], 1) == []
                assert rotate([1, 2], 0) == [1, 2]
        """),
    ),
    candidates=(
        _cand("""
            def rotate(xs, k):
                return xs[-k:] + xs[:-k]
        """, False, "no modulo: k >= len(xs) leaves the list unrotated"),
        _cand("""
            def rotate(xs, k):
                if not xs:
                    return []
                k %= len(xs)
                return xs[-k:] + xs[:-k]
        """, True, "correct"),
        _cand("""
            def rotate(xs, k):
                if not xs:
                    return []
                k %= len(xs)
                return xs[k:] + xs[:k]
        """, False, "rotates to the left (fits the wrong test)"),
    ),
)

_TO_ROMAN = CodeTask(
    id="to_roman",
    function="to_roman",
    spec=(
        "to_roman(n: int) -> str\n"
        "The standard Roman numeral for 1 <= n <= 3999, in uppercase, using the subtractive pairs IV, IX, XL, "
        "XC, CD and CM."
    ),
    examples=(("to_roman(3)", "'III'"), ("to_roman(4)", "'IV'"), ("to_roman(1994)", "'MCMXCIV'"),
              ("to_roman(3999)", "'MMMCMXCIX'")),
    tests=(
        _test("""
            def test_nine():
                assert to_roman(9) == "IX"
        """),
        _test("""
            def test_forties():
                assert to_roman(40) == "XL"
                assert to_roman(49) == "XLIX"
        """),
        _test("""
            def test_year():
                assert to_roman(2024) == "MMXXIV"
        """),
        _test("""
            def test_repeated_symbols():
                assert to_roman(8) == "VIII"
        """),
    ),
    candidates=(
        _cand("""
            def to_roman(n):
                symbols = [(1000, "M"), (500, "D"), (100, "C"), (50, "L"), (10, "X"), (5, "V"), (1, "I")]
                out = []
                for value, symbol in symbols:
                    while n >= value:
                        out.append(symbol)
                        n -= value
                return "".join(out)
        """, False, "no subtractive pairs: 4 becomes 'IIII'"),
        _cand("""
            def to_roman(n):
                symbols = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
                           (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]
                out = []
                for value, symbol in symbols:
                    while n >= value:
                        out.append(symbol)
                        n -= value
                return "".join(out)
        """, True, "correct: greedy over the 13 symbols"),
        _cand("""
            def to_roman(n):
                symbols = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
                           (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]
                out = []
                for value, symbol in symbols:
                    if n >= value:
                        out.append(symbol)
                        n -= value
                return "".join(out)
        """, False, "uses each symbol at most once: 3 becomes 'I'"),
    ),
)

_IS_LEAP_YEAR = CodeTask(
    id="is_leap_year",
    function="is_leap_year",
    spec=(
        "is_leap_year(year: int) -> bool\n"
        "The Gregorian rule: a year divisible by 4 is a leap year, except that a year divisible by 100 is a "
        "leap year only when it is also divisible by 400."
    ),
    examples=(("is_leap_year(2024)", "True"), ("is_leap_year(2023)", "False"), ("is_leap_year(2000)", "True"),
              ("is_leap_year(2100)", "False")),
    tests=(
        _test("""
            def test_ordinary_leap_year():
                assert is_leap_year(1996)
        """),
        _test("""
            def test_common_year():
                assert not is_leap_year(2019)
        """),
        _wrong("""
            def test_1900():
                assert is_leap_year(1900)
        """, "1900 is divisible by 100 but not by 400, so it is not a leap year."),
        _test("""
            def test_divisible_by_400():
                assert is_leap_year(1600)
                assert is_leap_year(2400)
        """),
    ),
    candidates=(
        _cand("""
            def is_leap_year(year):
                return year % 4 == 0
        """, False, "divisible by 4 only, ignoring the century rule (fits the wrong test)"),
        _cand("""
            def is_leap_year(year):
                return year % 4 == 0 and year % 100 != 0
        """, False, "forgets the 400 exception: 2000 is not leap"),
        _cand("""
            def is_leap_year(year):
                return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
        """, True, "correct"),
        _cand("""
            def is_leap_year(year):
                import calendar
                return calendar.isleap(year)
        """, True, "correct: calendar.isleap"),
    ),
)

_DEDUPE = CodeTask(
    id="dedupe",
    function="dedupe",
    spec=(
        "dedupe(xs: list) -> list\n"
        "Return a new list without repeated items, keeping the first occurrence of each item, in the original "
        "order. Items are hashable; xs is not modified."
    ),
    examples=(("dedupe([3, 1, 3, 2, 1])", "[3, 1, 2]"), ("dedupe(['b', 'a', 'b'])", "['b', 'a']"),
              ("dedupe([])", "[]")),
    tests=(
        _test("""
            def test_order_kept():
                assert dedupe([5, 4, 5, 3]) == [5, 4, 3]
        """),
        _test("""
            def test_no_repeats():
                assert dedupe([1, 2, 3]) == [1, 2, 3]
        """),
        _test("""
            def test_all_the_same():
                assert dedupe(["x", "x", "x"]) == ["x"]
        """),
        _test("""
            def test_input_unchanged():
                xs = [1, 1, 2]
                dedupe(xs)
                assert xs == [1, 1, 2]
        """),
    ),
    candidates=(
        _cand("""
            def dedupe(xs):
                return sorted(set(xs))
        """, False, "sorts the distinct items instead of keeping their order"),
        _cand("""
            def dedupe(xs):
                seen = set()
                out = []
                for x in xs:
                    if x not in seen:
                        seen.add(x)
                        out.append(x)
                return out
        """, True, "correct: a seen set"),
        _cand("""
            def dedupe(xs):
                return [x for i, x in enumerate(xs) if x not in xs[i + 1:]]
        """, False, "keeps the last occurrence instead of the first"),
        _cand("""
            def dedupe(xs):
                return list(dict.fromkeys(xs))
        """, True, "correct: dict.fromkeys"),
    ),
)

_SECOND_LARGEST = CodeTask(
    id="second_largest",
    function="second_largest",
    spec=(
        "second_largest(xs: list[int]) -> int | None\n"
        "The second largest distinct value in xs, or None when xs holds fewer than two distinct values."
    ),
    examples=(
        ("second_largest([3, 1, 2])", "2"),
        ("second_largest([7, 7, 2, 7])", "2"),
        ("second_largest([5, 5])", "None"),
        ("second_largest([])", "None"),
    ),
    tests=(
        _test("""
            def test_three_values():
                assert second_largest([10, 4, 8]) == 8
        """),
        _test("""
            def test_four_values():
                assert second_largest([1, 2, 3, 4]) == 3
        """),
        _wrong("""
            def test_repeated_maximum():
                assert second_largest([5, 5, 3]) == 5
        """, "The values must be distinct, so the answer for [5, 5, 3] is 3, not 5."),
        _test("""
            def test_negatives():
                assert second_largest([-1, -5, -3]) == -3
        """),
        _test("""
            def test_single_value():
                assert second_largest([9]) is None
        """),
    ),
    candidates=(
        _cand("""
            def second_largest(xs):
                ordered = sorted(xs)
                return ordered[-2] if len(ordered) >= 2 else None
        """, False, "ignores distinctness (fits the wrong test)"),
        _cand("""
            def second_largest(xs):
                distinct = sorted(set(xs))
                return distinct[1] if len(distinct) >= 2 else None
        """, False, "second smallest distinct value: indexes from the wrong end"),
        _cand("""
            def second_largest(xs):
                distinct = sorted(set(xs))
                return distinct[-2] if len(distinct) >= 2 else None
        """, True, "correct"),
    ),
)

_CHUNK = CodeTask(
    id="chunk",
    function="chunk",
    spec=(
        "chunk(xs: list, n: int) -> list[list]\n"
        "Split xs into consecutive lists of n items (n >= 1), in order; the last one holds the leftover items "
        "and may be shorter. An empty xs gives []."
    ),
    examples=(
        ("chunk([1, 2, 3, 4, 5], 2)", "[[1, 2], [3, 4], [5]]"),
        ("chunk([1, 2, 3], 3)", "[[1, 2, 3]]"),
        ("chunk([], 4)", "[]"),
        ("chunk([1, 2], 5)", "[[1, 2]]"),
    ),
    tests=(
        _test("""
            def test_even_split():
                assert chunk([1, 2, 3, 4], 2) == [[1, 2], [3, 4]]
        """),
        _test("""
            def test_leftover():
                assert chunk(["a", "b", "c", "d", "e"], 3) == [["a", "b", "c"], ["d", "e"]]
        """),
        _test("""
            def test_size_one():
                assert chunk([7, 8], 1) == [[7], [8]]
        """),
        _test("""
            def test_empty():
                assert chunk([], 2) == []
        """),
    ),
    candidates=(
        _cand("""
            def chunk(xs, n):
                return [xs[i:i + n] for i in range(len(xs))]
        """, False, "sliding windows starting at every index instead of chunks"),
        _cand("""
            def chunk(xs, n):
                return [xs[i:i + n] for i in range(0, len(xs), n)]
        """, True, "correct"),
        _cand("""
            def chunk(xs, n):
                return [xs[i:i + n] for i in range(0, len(xs) - n + 1, n)]
        """, False, "drops the shorter last chunk"),
    ),
)

_RUN_LENGTH_ENCODE = CodeTask(
    id="run_length_encode",
    function="run_length_encode",
    spec=(
        "run_length_encode(s: str) -> str\n"
        "Replace each maximal run of one repeated character by that character followed by the run's length in "
        "decimal. The length is always written, even for runs of 1: 'aaab' -> 'a3b1'."
    ),
    examples=(
        ("run_length_encode('aaab')", "'a3b1'"),
        ("run_length_encode('aabccc')", "'a2b1c3'"),
        ("run_length_encode('wwwwwwwwwwww')", "'w12'"),
        ("run_length_encode('')", "''"),
    ),
    tests=(
        _test("""
            def test_pairs():
                assert run_length_encode("aabb") == "a2b2"
        """),
        _test("""
            def test_single_run():
                assert run_length_encode("zzz") == "z3"
        """),
        _wrong("""
            def test_singletons_stay_bare():
                assert run_length_encode("abcd") == "abcd"
        """, "The spec writes the length even for runs of 1, so the answer is 'a1b1c1d1'."),
        _test("""
            def test_long_run():
                assert run_length_encode("xxxxxxxxxx") == "x10"
        """),
        _test("""
            def test_empty():
                assert run_length_encode("") == ""
        """),
    ),
    candidates=(
        _cand("""
            def run_length_encode(s):
                from itertools import groupby
                out = []
                for ch, run in groupby(s):
                    n = len(list(run))
                    out.append(ch + (str(n) if n > 1 else ""))
                return "".join(out)
        """, False, "omits the length of runs of 1 (fits the wrong test)"),
        _cand("""
            def run_length_encode(s):
                from itertools import groupby
                return "".join(ch + str(len(list(run))) for ch, run in groupby(s))
        """, True, "correct: itertools.groupby"),
        _cand("""
            def run_length_encode(s):
                out = ""
                prev, n = "", 0
                for ch in s:
                    if ch == prev:
                        n += 1
                    else:
                        if prev:
                            out += prev + str(n)
                        prev, n = ch, 1
                return out
        """, False, "never emits the last run"),
    ),
)

_TITLE_CASE = CodeTask(
    id="title_case",
    function="title_case",
    spec=(
        "title_case(s: str) -> str\n"
        "Uppercase the first character of every word and lowercase the rest of the word, where words are the "
        "pieces of s between single space characters (s.split(' ')). Every space is kept, so runs of spaces "
        "survive; only spaces start a new word (not apostrophes)."
    ),
    examples=(
        ("title_case('hello world')", "'Hello World'"),
        ("title_case('hELLO  wORLD')", "'Hello  World'"),
        ("title_case(\"it's ok\")", "\"It's Ok\""),
        ("title_case('')", "''"),
    ),
    tests=(
        _test("""
            def test_two_words():
                assert title_case("good morning") == "Good Morning"
        """),
        _test("""
            def test_mixed_case():
                assert title_case("pYTHON") == "Python"
        """),
        _test("""
            def test_apostrophe():
                assert title_case("don't stop") == "Don't Stop"
        """),
        _test("""
            def test_double_space():
                assert title_case("a  b") == "A  B"
        """),
    ),
    candidates=(
        _cand("""
            def title_case(s):
                return s[:1].upper() + s[1:].lower()
        """, False, "capitalises only the first word"),
        _cand("""
            def title_case(s):
                return s.title()
        """, False, "str.title also capitalises after an apostrophe"),
        _cand("""
            def title_case(s):
                return " ".join(w.capitalize() for w in s.split())
        """, False, "collapses runs of spaces"),
        _cand("""
            def title_case(s):
                return " ".join(w[:1].upper() + w[1:].lower() for w in s.split(" "))
        """, True, "correct"),
    ),
)

_MEDIAN = CodeTask(
    id="median",
    function="median",
    spec=(
        "median(xs: list[float]) -> float\n"
        "The median of a non-empty list of numbers: the middle value of the sorted list, or, for an even "
        "length, the mean of the two middle values."
    ),
    examples=(("median([3, 1, 2])", "2"), ("median([4, 1, 3, 2])", "2.5"), ("median([5])", "5"),
              ("median([1, 2, 2, 9])", "2.0")),
    tests=(
        _test("""
            def test_odd_length():
                assert median([9, 1, 5]) == 5
        """),
        _test("""
            def test_even_length():
                assert median([1, 3, 5, 7]) == 4
        """),
        _over("""
            def test_whole_mean_is_an_int():
                result = median([2, 4])
                assert result == 3 and isinstance(result, int)
        """, "The spec fixes the value 3 but not its type, so returning the float 3.0 is also correct."),
        _test("""
            def test_unsorted_input():
                assert median([10, 2, 6]) == 6
        """),
        _test("""
            def test_negatives():
                assert median([-3, -1]) == -2
        """),
    ),
    candidates=(
        _cand("""
            def median(xs):
                import statistics
                return statistics.median(xs)
        """, True, "correct: statistics.median"),
        _cand("""
            def median(xs):
                m = len(xs) // 2
                return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2
        """, False, "forgets to sort"),
        _cand("""
            def median(xs):
                s = sorted(xs)
                m = len(s) // 2
                return s[m] if len(s) % 2 else (s[m - 1] + s[m]) // 2
        """, False, "integer division of the middle pair (fits the overspecified test)"),
        _cand("""
            def median(xs):
                s = sorted(xs)
                m = len(s) // 2
                return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2
        """, True, "correct"),
    ),
)

_SAFE_DIV = CodeTask(
    id="safe_div",
    function="safe_div",
    spec=(
        "safe_div(a: int, b: int) -> int | None\n"
        "Floor division a // b (rounding toward negative infinity), or None when b == 0 instead of raising."
    ),
    examples=(("safe_div(7, 2)", "3"), ("safe_div(-7, 2)", "-4"), ("safe_div(5, 0)", "None"), ("safe_div(0, 3)", "0")),
    tests=(
        _test("""
            def test_exact():
                assert safe_div(12, 4) == 3
        """),
        _test("""
            def test_rounds_down():
                assert safe_div(9, 4) == 2
        """),
        _test("""
            def test_zero_divisor():
                assert safe_div(1, 0) is None
        """),
        _test("""
            def test_negative():
                assert safe_div(-9, 4) == -3
        """),
    ),
    candidates=(
        _cand("""
            def safe_div(a, b):
                if b == 0:
                    return None
                return int(a / b)
        """, False, "truncates toward zero instead of flooring"),
        _cand("""
            def safe_div(a, b):
                return None if b == 0 else a // b
        """, True, "correct"),
        _cand("""
            def safe_div(a, b):
                try:
                    return a // b
                except ZeroDivisionError:
                    return 0
        """, False, "returns 0 instead of None for a zero divisor"),
    ),
)

_FLATTEN = CodeTask(
    id="flatten",
    function="flatten",
    spec=(
        "flatten(xs: list[list]) -> list\n"
        "Concatenate the inner lists of xs, in order, into one new list. Only one level is removed: lists "
        "nested deeper stay as they are."
    ),
    examples=(
        ("flatten([[1, 2], [3], []])", "[1, 2, 3]"),
        ("flatten([[1, [2]], [3]])", "[1, [2], 3]"),
        ("flatten([])", "[]"),
    ),
    tests=(
        _test("""
            def test_two_lists():
                assert flatten([[1], [2, 3]]) == [1, 2, 3]
        """),
        _test("""
            def test_empty_inner_lists():
                assert flatten([[], [], [4]]) == [4]
        """),
        _over("""
            def test_scalars_pass_through():
                assert flatten([1, [2, 3], 4]) == [1, 2, 3, 4]
        """, "The spec only covers a list of lists; what happens to an item that is not a list is left open."),
        _test("""
            def test_strings_are_items():
                assert flatten([["ab", "c"], ["d"]]) == ["ab", "c", "d"]
        """),
    ),
    candidates=(
        _cand("""
            def flatten(xs):
                out = []
                for inner in xs:
                    out.append(inner)
                return out
        """, False, "appends the inner lists instead of their items"),
        _cand("""
            def flatten(xs):
                out = []
                for x in xs:
                    if isinstance(x, list):
                        out.extend(flatten(x))
                    else:
                        out.append(x)
                return out
        """, False, "flattens recursively, every level (fits the overspecified test)"),
        _cand("""
            def flatten(xs):
                return [item for inner in xs for item in inner]
        """, True, "correct"),
    ),
)

_WORD_COUNT = CodeTask(
    id="word_count",
    function="word_count",
    spec=(
        "word_count(text: str) -> dict[str, int]\n"
        "Count the words of text: words are the pieces separated by any whitespace (str.split()), compared "
        "case-insensitively and reported in lowercase."
    ),
    examples=(
        ("word_count('the cat the')", "{'the': 2, 'cat': 1}"),
        ("word_count('Go go GO')", "{'go': 3}"),
        ("word_count('')", "{}"),
        ("word_count('  A  a b ')", "{'a': 2, 'b': 1}"),
    ),
    tests=(
        _test("""
            def test_repeats():
                assert word_count("a b a") == {"a": 2, "b": 1}
        """),
        _test("""
            def test_case_insensitive():
                assert word_count("Hi hi") == {"hi": 2}
        """),
        _test(r"""
            def test_any_whitespace():
                assert word_count("x  y\tx\n") == {"x": 2, "y": 1}
        """),
        _test("""
            def test_blank():
                assert word_count("   ") == {}
        """),
    ),
    candidates=(
        _cand("""
            def word_count(text):
                counts = {}
                for word in text.lower().split(" "):
                    counts[word] = counts.get(word, 0) + 1
                return counts
        """, False, "splits on single spaces, so empty strings become words"),
        _cand("""
            def word_count(text):
                from collections import Counter
                return dict(Counter(text.split()))
        """, False, "case-sensitive"),
        _cand("""
            def word_count(text):
                from collections import Counter
                return dict(Counter(text.lower().split()))
        """, True, "correct"),
    ),
)

_PARSE_INTS = CodeTask(
    id="parse_ints",
    function="parse_ints",
    spec=(
        "parse_ints(text: str) -> list[int]\n"
        "Split text on commas and convert every item to an int, in order. Whitespace around an item is ignored "
        "and an item may carry a sign, as in ' -3' or '+7'. Callers guarantee that every item is an integer."
    ),
    examples=(
        ("parse_ints('1,2,3')", "[1, 2, 3]"),
        ("parse_ints(' 10 , -4,+7')", "[10, -4, 7]"),
        ("parse_ints('0')", "[0]"),
    ),
    tests=(
        _test("""
            def test_spaces_around_items():
                assert parse_ints("4, 5 ,6") == [4, 5, 6]
        """),
        _test("""
            def test_single_item():
                assert parse_ints("42") == [42]
        """),
        _over("""
            def test_empty_string():
                assert parse_ints("") == []
        """, "The empty string has one empty item, which is not an integer, so the spec leaves its result open."),
        _test("""
            def test_large_numbers():
                assert parse_ints("1000000,7") == [1000000, 7]
        """),
    ),
    candidates=(
        _cand("""
            def parse_ints(text):
                return [int(item) for item in text.split(", ")]
        """, False, "splits on ', ' only"),
        _cand("""
            def parse_ints(text):
                return [int(item) for item in text.split(",") if item.strip().isdigit()]
        """, False, "skips items that are not plain digits, dropping signed numbers (fits the overspecified test)"),
        _cand("""
            def parse_ints(text):
                return [int(item) for item in text.split(",")]
        """, True, "correct: int() ignores surrounding whitespace"),
    ),
)

_IS_PRIME = CodeTask(
    id="is_prime",
    function="is_prime",
    spec=(
        "is_prime(n: int) -> bool\n"
        "True when n is prime (an integer greater than 1 whose only positive divisors are 1 and n); False for "
        "every n < 2, negatives included."
    ),
    examples=(("is_prime(2)", "True"), ("is_prime(15)", "False"), ("is_prime(1)", "False"), ("is_prime(97)", "True"),
              ("is_prime(-7)", "False")),
    tests=(
        _test("""
            def test_small_primes():
                assert all(is_prime(p) for p in [2, 3, 5, 7, 11, 13])
        """),
        _test("""
            def test_composites():
                assert not any(is_prime(c) for c in [4, 9, 25, 49, 91])
        """),
        _test("""
            def test_below_two():
                assert not is_prime(0)
                assert not is_prime(1)
        """),
        _test("""
            def test_square_of_prime():
                assert not is_prime(121)
        """),
    ),
    candidates=(
        _cand("""
            def is_prime(n):
                if n < 2:
                    return False
                return all(n % d for d in range(2, int(n ** 0.5)))
        """, False, "stops one short of the square root, so squares of primes pass"),
        _cand("""
            def is_prime(n):
                import math
                if n < 2:
                    return False
                return all(n % d for d in range(2, math.isqrt(n) + 1))
        """, True, "correct: trial division up to isqrt(n)"),
        _cand("""
            def is_prime(n):
                return all(n % d for d in range(2, n))
        """, False, "no special case below 2: 1, 0 and negatives count as prime"),
    ),
)

_MERGE_DICTS = CodeTask(
    id="merge_dicts",
    function="merge_dicts",
    spec=(
        "merge_dicts(a: dict, b: dict) -> dict\n"
        "Return a new dict holding the keys of both a and b; for a key in both, b's value wins. Neither "
        "argument is modified."
    ),
    examples=(
        ("merge_dicts({'x': 1}, {'y': 2})", "{'x': 1, 'y': 2}"),
        ("merge_dicts({'x': 2}, {'x': 1})", "{'x': 1}"),
        ("merge_dicts({}, {})", "{}"),
        ("merge_dicts({'k': 'old', 'j': 0}, {'k': 'new'})", "{'k': 'new', 'j': 0}"),
    ),
    tests=(
        _test("""
            def test_disjoint_keys():
                assert merge_dicts({"a": 1}, {"b": 2}) == {"a": 1, "b": 2}
        """),
        _test("""
            def test_second_wins():
                assert merge_dicts({"a": 1}, {"a": 5}) == {"a": 5}
        """),
        _over("""
            def test_keys_sorted():
                assert list(merge_dicts({"b": 1}, {"a": 2})) == ["a", "b"]
        """, "The spec says nothing about key order (and dict equality ignores it), so sorted keys are not required."),
        _test("""
            def test_inputs_unchanged():
                a, b = {"a": 1}, {"a": 2, "c": 3}
                merge_dicts(a, b)
                assert a == {"a": 1} and b == {"a": 2, "c": 3}
        """),
    ),
    candidates=(
        _cand("""
            def merge_dicts(a, b):
                return dict(sorted(list(a.items()) + list(b.items())))
        """, False, "sorts the combined pairs, so on a clash the larger value wins (fits the overspecified test)"),
        _cand("""
            def merge_dicts(a, b):
                return {**b, **a}
        """, False, "a's value wins on a clash"),
        _cand("""
            def merge_dicts(a, b):
                merged = dict(a)
                merged.update(b)
                return merged
        """, True, "correct"),
    ),
)

_DIGIT_SUM = CodeTask(
    id="digit_sum",
    function="digit_sum",
    spec=(
        "digit_sum(n: int) -> int\n"
        "The sum of the decimal digits of n. The sign of a negative n is ignored, so digit_sum(-12) == 3."
    ),
    examples=(("digit_sum(123)", "6"), ("digit_sum(0)", "0"), ("digit_sum(-45)", "9"), ("digit_sum(1000)", "1")),
    tests=(
        _test("""
            def test_several_digits():
                assert digit_sum(9875) == 29
        """),
        _test("""
            def test_zero():
                assert digit_sum(0) == 0
        """),
        _test("""
            def test_negative():
                assert digit_sum(-301) == 4
        """),
        _test("""
            def test_single_digit():
                assert digit_sum(7) == 7
        """),
    ),
    candidates=(
        _cand("""
            def digit_sum(n):
                total = 0
                while n > 0:
                    total += n % 10
                    n //= 10
                return total
        """, False, "loops while n > 0, so any negative n gives 0"),
        _cand("""
            def digit_sum(n):
                return sum(int(c) for c in str(abs(n)))
        """, True, "correct"),
        _cand("""
            def digit_sum(n):
                return len(str(abs(n)))
        """, False, "counts the digits instead of adding them"),
    ),
)

_PARSE_BOOL = CodeTask(
    id="parse_bool",
    function="parse_bool",
    spec=(
        "parse_bool(text: str) -> bool\n"
        "Case-insensitively and ignoring surrounding whitespace, 'true', 'yes' and '1' mean True and 'false', "
        "'no' and '0' mean False. Other inputs are not covered by this spec."
    ),
    examples=(("parse_bool('yes')", "True"), ("parse_bool('  FALSE ')", "False"), ("parse_bool('True')", "True"),
              ("parse_bool('0')", "False")),
    tests=(
        _test("""
            def test_true_words():
                assert all(parse_bool(word) for word in ["true", "yes", "1"])
        """),
        _test("""
            def test_false_words():
                assert not any(parse_bool(word) for word in ["false", "no", "0"])
        """),
        _over("""
            def test_rejects_unknown_words():
                try:
                    parse_bool("maybe")
                except ValueError:
                    return
                raise AssertionError("expected ValueError")
        """, "The spec leaves inputs other than the six words open, so it does not require a ValueError."),
        _test("""
            def test_returns_real_bools():
                assert parse_bool("yes") is True
                assert parse_bool("no") is False
        """),
    ),
    candidates=(
        _cand("""
            def parse_bool(text):
                return bool(text)
        """, False, "truthiness of the string: any non-empty text is True"),
        _cand("""
            def parse_bool(text):
                words = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
                return words[text.strip().lower()]
        """, True, "correct: a lookup table (unknown words raise KeyError)"),
        _cand("""
            def parse_bool(text):
                if text in ("true", "yes", "1"):
                    return True
                if text in ("false", "no", "0"):
                    return False
                raise ValueError(f"not a boolean: {text!r}")
        """, False, "exact lowercase matches only, no stripping (fits the overspecified test)"),
        _cand("""
            def parse_bool(text):
                return text.strip().lower() in ("true", "yes", "1")
        """, True, "correct: membership in the true words"),
    ),
)

_TRUNCATE = CodeTask(
    id="truncate",
    function="truncate",
    spec=(
        "truncate(text: str, width: int) -> str\n"
        "For width >= 3: text unchanged if len(text) <= width, otherwise its first width - 3 characters "
        "followed by '...', so that the result is exactly width characters long."
    ),
    examples=(
        ("truncate('hello world', 8)", "'hello...'"),
        ("truncate('short', 10)", "'short'"),
        ("truncate('exact', 5)", "'exact'"),
        ("truncate('abcdef', 3)", "'...'"),
    ),
    tests=(
        _test("""
            def test_cut():
                assert truncate("abcdefghij", 6) == "abc..."
        """),
        _test("""
            def test_fits_exactly():
                assert truncate("abc", 3) == "abc"
        """),
        _test("""
            def test_result_length():
                assert len(truncate("x" * 50, 10)) == 10
        """),
        _test("""
            def test_empty():
                assert truncate("", 5) == ""
        """),
    ),
    candidates=(
        _cand("""
            def truncate(text, width):
                if len(text) <= width:
                    return text
                return text[:width - 3] + "..."
        """, True, "correct"),
        _cand("""
            def truncate(text, width):
                if len(text) <= width:
                    return text
                return text[:width] + "..."
        """, False, "keeps width characters before the dots, overshooting the width"),
        _cand("""
            def truncate(text, width):
                if len(text) < width:
                    return text
                return text[:width - 3] + "..."
        """, False, "off by one: cuts a text that fits exactly"),
    ),
)

_REVERSE_WORDS = CodeTask(
    id="reverse_words",
    function="reverse_words",
    spec=(
        "reverse_words(s: str) -> str\n"
        "The whitespace-separated words of s in reverse order, joined by single spaces; leading, trailing and "
        "repeated whitespace disappear. The letters inside each word keep their order."
    ),
    examples=(
        ("reverse_words('hello world')", "'world hello'"),
        ("reverse_words('  a  b c ')", "'c b a'"),
        ("reverse_words('')", "''"),
        ("reverse_words('one')", "'one'"),
    ),
    tests=(
        _test("""
            def test_three_words():
                assert reverse_words("x y z") == "z y x"
        """),
        _test("""
            def test_extra_spaces():
                assert reverse_words(" hi   there ") == "there hi"
        """),
        _test("""
            def test_single_word():
                assert reverse_words("solo") == "solo"
        """),
        _test("""
            def test_letters_keep_order():
                assert reverse_words("ab cd") == "cd ab"
        """),
    ),
    candidates=(
        _cand("""
            def reverse_words(s):
                return " ".join(s.split(" ")[::-1])
        """, False, "splits on single spaces, so extra spaces survive"),
        _cand("""
            def reverse_words(s):
                return " ".join(reversed(s.split()))
        """, True, "correct"),
        _cand("""
            def reverse_words(s):
                return s[::-1]
        """, False, "reverses the characters, not the words"),
    ),
)

_RUNNING_SUM = CodeTask(
    id="running_sum",
    function="running_sum",
    spec=(
        "running_sum(xs: list[int]) -> list[int]\n"
        "The prefix sums of xs: a new list of the same length whose element i is xs[0] + ... + xs[i]."
    ),
    examples=(("running_sum([1, 2, 3])", "[1, 3, 6]"), ("running_sum([])", "[]"),
              ("running_sum([5, -5, 2])", "[5, 0, 2]")),
    tests=(
        _test("""
            def test_ones():
                assert running_sum([1, 1, 1, 1]) == [1, 2, 3, 4]
        """),
        _test("""
            def test_single():
                assert running_sum([9]) == [9]
        """),
        _test("""
            def test_negatives():
                assert running_sum([-1, -2]) == [-1, -3]
        """),
    ),
    candidates=(
        _cand("""
            def running_sum(xs):
                out, total = [], 0
                for x in xs:
                    out.append(total)
                    total += x
                return out
        """, False, "sums before the current element (exclusive prefix sums)"),
        _cand("""
            def running_sum(xs):
                from itertools import accumulate
                return list(accumulate(xs))
        """, True, "correct: itertools.accumulate"),
        _cand("""
            def running_sum(xs):
                return [sum(xs[:i]) for i in range(1, len(xs))]
        """, False, "off by one: one element short"),
    ),
)

_IS_ANAGRAM = CodeTask(
    id="is_anagram",
    function="is_anagram",
    spec=(
        "is_anagram(a: str, b: str) -> bool\n"
        "True when a and b contain the same characters the same number of times, ignoring case and spaces "
        "(every other character counts as it is)."
    ),
    examples=(
        ("is_anagram('listen', 'silent')", "True"),
        ("is_anagram('Dormitory', 'dirty room')", "True"),
        ("is_anagram('aab', 'abb')", "False"),
        ("is_anagram('abc', 'abcd')", "False"),
    ),
    tests=(
        _test("""
            def test_simple():
                assert is_anagram("evil", "vile")
        """),
        _test("""
            def test_counts_matter():
                assert not is_anagram("aabb", "ab")
        """),
        _test("""
            def test_case_and_spaces():
                assert is_anagram("Astronomer", "Moon starer")
        """),
        _test("""
            def test_different_letters():
                assert not is_anagram("cat", "dog")
        """),
    ),
    candidates=(
        _cand("""
            def is_anagram(a, b):
                return set(a.replace(" ", "").lower()) == set(b.replace(" ", "").lower())
        """, False, "compares sets, ignoring how often each letter occurs"),
        _cand("""
            def is_anagram(a, b):
                return sorted(a.lower()) == sorted(b.lower())
        """, False, "spaces still count"),
        _cand("""
            def is_anagram(a, b):
                return sorted(a.replace(" ", "").lower()) == sorted(b.replace(" ", "").lower())
        """, True, "correct"),
    ),
)

_SNAKE_TO_CAMEL = CodeTask(
    id="snake_to_camel",
    function="snake_to_camel",
    spec=(
        "snake_to_camel(name: str) -> str\n"
        "Convert a snake_case name to lowerCamelCase: drop the underscores and uppercase the first letter of "
        "every word after the first, leaving all other letters (and the whole first word) as they are."
    ),
    examples=(
        ("snake_to_camel('hello_world')", "'helloWorld'"),
        ("snake_to_camel('get_http_response')", "'getHttpResponse'"),
        ("snake_to_camel('parse_URL')", "'parseURL'"),
        ("snake_to_camel('x')", "'x'"),
    ),
    tests=(
        _test("""
            def test_two_words():
                assert snake_to_camel("max_value") == "maxValue"
        """),
        _test("""
            def test_one_letter_words():
                assert snake_to_camel("a_b_c") == "aBC"
        """),
        _test("""
            def test_single_word():
                assert snake_to_camel("name") == "name"
        """),
        _test("""
            def test_other_letters_kept():
                assert snake_to_camel("to_JSON") == "toJSON"
        """),
    ),
    candidates=(
        _cand("""
            def snake_to_camel(name):
                first, *rest = name.split("_")
                return first + "".join(word[:1].upper() + word[1:] for word in rest)
        """, True, "correct"),
        _cand("""
            def snake_to_camel(name):
                first, *rest = name.split("_")
                return first + "".join(word.capitalize() for word in rest)
        """, False, "str.capitalize lowercases the rest of each word"),
        _cand("""
            def snake_to_camel(name):
                return "".join(word[:1].upper() + word[1:] for word in name.split("_"))
        """, False, "capitalises the first word too (PascalCase)"),
    ),
)

_FORMAT_DURATION = CodeTask(
    id="format_duration",
    function="format_duration",
    spec=(
        "format_duration(seconds: int) -> str\n"
        "Format a non-negative number of seconds as 'M:SS': the whole minutes (no padding, and not wrapped into "
        "hours, so they may exceed 59), a colon, then the remaining seconds as two digits."
    ),
    examples=(
        ("format_duration(75)", "'1:15'"),
        ("format_duration(5)", "'0:05'"),
        ("format_duration(600)", "'10:00'"),
        ("format_duration(3661)", "'61:01'"),
    ),
    tests=(
        _test("""
            def test_one_minute():
                assert format_duration(60) == "1:00"
        """),
        _test("""
            def test_seconds_padded():
                assert format_duration(62) == "1:02"
        """),
        _test("""
            def test_zero():
                assert format_duration(0) == "0:00"
        """),
        _test("""
            def test_over_an_hour():
                assert format_duration(7199) == "119:59"
        """),
    ),
    candidates=(
        _cand("""
            def format_duration(seconds):
                return f"{seconds // 60}:{seconds % 60}"
        """, False, "does not pad the seconds"),
        _cand("""
            def format_duration(seconds):
                minutes, rest = divmod(seconds, 60)
                return f"{minutes}:{rest:02d}"
        """, True, "correct"),
        _cand("""
            def format_duration(seconds):
                return f"{seconds // 60 % 60}:{seconds % 60:02d}"
        """, False, "wraps the minutes at 60 as if hours were shown"),
    ),
)

_INDEX_OF = CodeTask(
    id="index_of",
    function="index_of",
    spec=(
        "index_of(xs: list, target) -> int\n"
        "The index of the first item of xs equal to target, or -1 when no item is."
    ),
    examples=(
        ("index_of([4, 5, 6], 5)", "1"),
        ("index_of([1, 2, 1], 1)", "0"),
        ("index_of([], 3)", "-1"),
        ("index_of(['a'], 'b')", "-1"),
    ),
    tests=(
        _test("""
            def test_found():
                assert index_of([10, 20, 30], 30) == 2
        """),
        _test("""
            def test_first_of_several():
                assert index_of([7, 8, 7, 8], 8) == 1
        """),
        _test("""
            def test_missing():
                assert index_of([1, 2], 9) == -1
        """),
        _test("""
            def test_empty():
                assert index_of([], None) == -1
        """),
    ),
    candidates=(
        _cand("""
            def index_of(xs, target):
                for i, x in enumerate(xs):
                    if x == target:
                        return i
                return -1
        """, True, "correct"),
        _cand("""
            def index_of(xs, target):
                return xs.index(target)
        """, False, "list.index raises ValueError instead of returning -1"),
        _cand("""
            def index_of(xs, target):
                found = -1
                for i, x in enumerate(xs):
                    if x == target:
                        found = i
                return found
        """, False, "returns the last match, not the first"),
    ),
)

_TO_BINARY = CodeTask(
    id="to_binary",
    function="to_binary",
    spec=(
        "to_binary(n: int) -> str\n"
        "The base-2 digits of a non-negative integer n, most significant first, without a '0b' prefix or "
        "leading zeros; to_binary(0) == '0'."
    ),
    examples=(("to_binary(5)", "'101'"), ("to_binary(0)", "'0'"), ("to_binary(8)", "'1000'"), ("to_binary(1)", "'1'")),
    tests=(
        _test("""
            def test_two():
                assert to_binary(2) == "10"
        """),
        _test("""
            def test_all_ones():
                assert to_binary(255) == "11111111"
        """),
        _test("""
            def test_zero():
                assert to_binary(0) == "0"
        """),
        _test("""
            def test_power_of_two():
                assert to_binary(1024) == "1" + "0" * 10
        """),
    ),
    candidates=(
        _cand("""
            def to_binary(n):
                return bin(n)
        """, False, "keeps the '0b' prefix"),
        _cand("""
            def to_binary(n):
                digits = ""
                while n > 0:
                    digits = str(n % 2) + digits
                    n //= 2
                return digits
        """, False, "returns '' for 0"),
        _cand("""
            def to_binary(n):
                return format(n, "b")
        """, True, "correct"),
        _cand("""
            def to_binary(n):
                digits = ""
                while n > 0:
                    digits += str(n % 2)
                    n //= 2
                return digits or "0"
        """, False, "emits the digits least significant first"),
    ),
)

# Tricky and plain tasks are interleaved so that any prefix of the set holds some of both.
CODE_TASKS: tuple[CodeTask, ...] = (
    _CLAMP,
    _IS_PALINDROME,
    _FIZZBUZZ,
    _COUNT_VOWELS,
    _GCD,
    _ROTATE,
    _TO_ROMAN,
    _IS_LEAP_YEAR,
    _DEDUPE,
    _SECOND_LARGEST,
    _CHUNK,
    _RUN_LENGTH_ENCODE,
    _TITLE_CASE,
    _MEDIAN,
    _SAFE_DIV,
    _FLATTEN,
    _WORD_COUNT,
    _PARSE_INTS,
    _IS_PRIME,
    _MERGE_DICTS,
    _DIGIT_SUM,
    _PARSE_BOOL,
    _TRUNCATE,
    _REVERSE_WORDS,
    _RUNNING_SUM,
    _IS_ANAGRAM,
    _SNAKE_TO_CAMEL,
    _FORMAT_DURATION,
    _INDEX_OF,
    _TO_BINARY,
)
"""The built-in task set, in a fixed order."""

_BY_ID: dict[str, CodeTask] = {task.id: task for task in CODE_TASKS}


def code_task(task_id: str) -> CodeTask:
    """The task with id ``task_id``; a ``KeyError`` that lists the valid ids if there is none."""
    try:
        return _BY_ID[task_id]
    except KeyError:
        raise KeyError(f"unknown code task {task_id!r}; valid ids: {', '.join(_BY_ID)}") from None


def run_tests_locally(task: CodeTask, candidate_source: str) -> dict[str, bool]:
    """Run each of ``task``'s tests against ``candidate_source`` and return ``{test name: passed}``.

    The code is executed IN THIS PROCESS, without any sandbox: use it only for trusted code such as the
    built-in candidates of this module, never for model-written code. A test passes when it returns without
    raising. Each test runs in a fresh namespace (exec of the candidate source, then the test source, then a
    call), so one test cannot disturb another; an error while defining the candidate fails every test.
    """
    results = {}
    for test in task.tests:
        namespace: dict = {}
        try:
            exec(candidate_source, namespace)  # noqa: S102 - trusted built-in code, see the docstring
            exec(test.source, namespace)  # noqa: S102
            namespace[test.name]()
        except Exception:  # noqa: BLE001 - any error, not only AssertionError, fails a test
            results[test.name] = False
        else:
            results[test.name] = True
    return results


def check_examples_locally(task: CodeTask, candidate_source: str) -> dict[str, bool]:
    """``{call expression: result == expected}`` for each of ``task``'s examples; an exception counts as False.

    Like :func:`run_tests_locally` this executes the code in this process, for trusted built-in code only.
    Each example is evaluated in a fresh namespace holding just the candidate's definitions.
    """
    results = {}
    for call, expected in task.examples:
        namespace: dict = {}
        try:
            exec(candidate_source, namespace)  # noqa: S102 - trusted built-in code, see the docstring
            results[call] = bool(eval(call, namespace) == ast.literal_eval(expected))
        except Exception:  # noqa: BLE001 - an example that raises is simply not met
            results[call] = False
    return results
