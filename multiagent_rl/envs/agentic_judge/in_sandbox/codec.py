"""Plain data across the boundary between a solution's process and the grader: exact built-in types only.

``encode`` runs on either side and turns a value into tagged JSON; ``decode`` rebuilds fresh built-in objects and
refuses anything malformed. A value of any other type (a subclass of ``int`` with its own ``__eq__``, a custom
object) crosses as an ``Opaque`` that equals nothing and has no truth value, so an object that claims to equal
everything cannot pass a check. Written for any Python 3.8+ the sandbox may have.
"""

MAX_DEPTH = 40
MAX_ITEMS = 100000

_SEQUENCES = {"l": list, "t": tuple, "S": set, "F": frozenset}


class Unsupported(Exception):
    """A value too large or too deeply nested to send."""


class SolutionError(Exception):
    """The solution's side failed: it died, ran out of time, or answered something that is not plain data."""


class Opaque(object):
    """A value the solution returned that is not plain data: equal to nothing, and neither true nor false."""

    def __init__(self, type_name):
        self.type_name = type_name

    def __eq__(self, other):
        return False

    def __ne__(self, other):
        return True

    def __hash__(self):
        return id(self)

    def __bool__(self):
        raise SolutionError("the solution returned a %s, not plain data" % self.type_name)

    def __repr__(self):
        return "<%s returned by the solution, not plain data>" % self.type_name


def encode(value, depth=0, budget=None):
    """Tagged JSON of ``value``; types other than the exact built-ins become ``["?", type name]``."""
    if budget is None:
        budget = [MAX_ITEMS]
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_DEPTH:
        raise Unsupported("the value is too large or too deeply nested")
    kind = type(value)
    if value is None:
        return ["N"]
    if kind is bool:
        return ["b", value]
    if kind is int:
        try:
            return ["i", str(value)]
        except ValueError:  # more digits than int-to-str allows
            raise Unsupported("the integer is too large")
    if kind is float:
        return ["f", repr(value)]
    if kind is complex:
        return ["c", repr(value.real), repr(value.imag)]
    if kind is str:
        return ["s", value]
    if kind is bytes:
        return ["y", value.hex()]
    if kind is bytearray:
        return ["Y", value.hex()]
    for tag, container in _SEQUENCES.items():
        if kind is container:
            return [tag, [encode(v, depth + 1, budget) for v in value]]
    if kind is dict:
        return ["d", [[encode(k, depth + 1, budget), encode(v, depth + 1, budget)] for k, v in value.items()]]
    name = getattr(kind, "__name__", "object")
    return ["?", name[:100] if isinstance(name, str) else "object"]


def decode(data, depth=0, budget=None):
    """The value ``encode`` described, as fresh built-in objects; ``ValueError`` for anything malformed."""
    if budget is None:
        budget = [MAX_ITEMS]
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_DEPTH:
        raise ValueError("too large or too deeply nested")
    if type(data) is not list or not data or type(data[0]) is not str:
        raise ValueError("not a tagged value")
    tag, rest = data[0], data[1:]
    if tag == "N" and not rest:
        return None
    if len(rest) == 1:
        (body,) = rest
        if tag == "b" and type(body) is bool:
            return body
        if tag == "i" and type(body) is str:
            return int(body)
        if tag == "f" and type(body) is str:
            return float(body)
        if tag == "s" and type(body) is str:
            return body
        if tag == "y" and type(body) is str:
            return bytes.fromhex(body)
        if tag == "Y" and type(body) is str:
            return bytearray.fromhex(body)
        if tag == "?" and type(body) is str:
            return Opaque(body[:100])
        if tag in _SEQUENCES and type(body) is list:
            return _SEQUENCES[tag](decode(v, depth + 1, budget) for v in body)
        if tag == "d" and type(body) is list:
            out = {}
            for pair in body:
                if type(pair) is not list or len(pair) != 2:
                    raise ValueError("not a key-value pair")
                out[decode(pair[0], depth + 1, budget)] = decode(pair[1], depth + 1, budget)
            return out
    if tag == "c" and len(rest) == 2 and all(type(x) is str for x in rest):
        return complex(float(rest[0]), float(rest[1]))
    raise ValueError("unknown or malformed tag %r" % (tag,))


def same(a, b):
    """Equal in type and value, all the way down."""
    if type(a) is not type(b):
        return False
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return len(a) == len(b) and all(any(same(k, j) and same(v, b[j]) for j in b) for k, v in a.items())
    if type(a) in (set, frozenset):
        return len(a) == len(b) and all(any(same(x, y) for y in b) for x in a)
    return a == b
