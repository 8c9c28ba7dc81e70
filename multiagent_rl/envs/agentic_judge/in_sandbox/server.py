"""The solution's side: loads ``solution.py`` and answers calls of its function, one JSON line per request.

Started by the grader as ``python3 -I -c <codec + this> FUNCTION`` with pipes on stdin and stdout. Requests:
``{"op": "load"}`` runs the solution's source in a fresh namespace (once per check, as a test module would);
``{"op": "call", "args": [...], "kwargs": {...}}`` calls its function. Everything here runs with the solution's code
in the same process, so nothing it sends is trusted: the grader decodes each answer into plain data and decides. The
solution's own output goes to stderr, so an honest ``print`` does not break the protocol.
"""

import json
import os
import stat
import sys


def _exception(exc):
    names = [c.__name__ for c in type(exc).__mro__ if isinstance(getattr(c, "__name__", None), str)]
    try:
        message = str(exc)[:500]
    except BaseException:  # noqa: BLE001 - a hostile __str__
        message = ""
    return {"raised": names[:20], "message": message}


def _read_source():
    # never block on a FIFO, never follow a link: a solution may have replaced the file in an earlier run
    fd = os.open("solution.py", os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError("solution.py is not a regular file")
        return f.read(1 << 20).decode("utf-8", errors="replace")


def _call(namespace, function_name, load_error, request):
    args = [decode(a) for a in request["args"]]  # noqa: F821 - prepended from codec.py
    kwargs = {k: decode(v) for k, v in request["kwargs"].items()}  # noqa: F821
    if load_error is not None:
        return _exception(load_error)
    function = namespace.get(function_name)
    if not callable(function):
        return {"raised": ["NameError", "Exception"], "message": "solution.py defines no function %r" % function_name}
    try:
        result = function(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt included: all are answers
        return _exception(exc)
    try:
        return {"value": encode(result), "args": [encode(a) for a in args],  # noqa: F821
                "kwargs": {k: encode(v) for k, v in kwargs.items()}}  # noqa: F821
    except Unsupported as exc:  # noqa: F821
        return {"raised": ["ValueError", "Exception"], "message": str(exc)}


def main():
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8", errors="replace")
    os.dup2(2, 1)
    function_name = sys.argv[1]
    try:
        source, source_error = _read_source(), None
    except OSError as exc:
        source, source_error = "", exc
    namespace, load_error = {}, source_error
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "load":
            namespace, load_error = {"__name__": "solution", "__builtins__": __builtins__}, source_error
            if source_error is None:
                try:
                    exec(compile(source, "solution.py", "exec"), namespace)
                except BaseException as exc:  # noqa: BLE001
                    load_error = exc
            reply = {"loaded": load_error is None}
        else:
            reply = _call(namespace, function_name, load_error, request)
        channel.write(json.dumps(reply) + "\n")
        channel.flush()


if __name__ == "__main__":  # started with python3 -I -c
    main()
