"""The grader's side: runs a task's tests (or checks its examples) against ``solution.py`` without ever running the
solution's code in its own process.

Started by the host as ``python3 -I -c <codec + this>`` in the sandbox, where it is the pid namespace's init
(``bwrap --as-pid-1``): the solution's processes can neither kill nor stop it. It turns itself non-dumpable, so
they cannot read its memory or open its descriptors either. stdin: a marker line (random, from the host), then the
task as one JSON line (the checks, the function's name, the server's source). The solution runs in its own process
(``server.py``), loaded into a fresh namespace for each check and started anew after any failure of that process;
the test's code runs here, calling the function through a proxy that sends plain data and rebuilds the answer as
fresh built-in objects (and the arguments too, for tests that check the inputs are left alone). Examples are
compared by type and value. The last line is the marker and the results as JSON; the lines
before it are for a reader.
"""

import ast
import builtins
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time

MAX_LINE = 1 << 20
MAX_NOTE = 200


def not_dumpable():
    try:
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
    except (OSError, AttributeError):
        pass


class Solution(object):
    """One fresh process of the solution, serving calls of its function."""

    def __init__(self, server, function, timeout):
        self.timeout = timeout
        self.proc = subprocess.Popen([sys.executable, "-I", "-c", server, function], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, close_fds=True,
                                     start_new_session=True)
        self.pending = b""
        self.errors = b""

    def call(self, args, kwargs):
        reply = self._ask({"op": "call", "args": [encode(a) for a in args],  # noqa: F821 - prepended from codec.py
                           "kwargs": {k: encode(v) for k, v in kwargs.items()}})  # noqa: F821
        try:
            reply = json.loads(reply)
            if "raised" in reply:
                exception = _rebuild(reply)
            else:
                exception = None
                value = decode(reply["value"])  # noqa: F821
                new_args = [decode(a) for a in reply["args"]]  # noqa: F821
                new_kwargs = {k: decode(v) for k, v in reply["kwargs"].items()}  # noqa: F821
        except Exception as exc:  # noqa: BLE001 - anything malformed is the solution's failure
            raise SolutionError("the solution's answer is not plain data (%s)" % type(exc).__name__)  # noqa: F821
        if exception is not None:
            raise exception
        for old, new in zip(list(args) + [kwargs[k] for k in kwargs],
                            new_args + [new_kwargs.get(k) for k in kwargs]):
            write_back(old, new)
        return value

    def load(self, timeout):
        """A fresh namespace with the solution's code in it (its errors surface at the first call)."""
        self.timeout = timeout
        self._ask({"op": "load"})

    def _ask(self, request):
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise SolutionError("the solution's process is gone%s" % self.last_error())  # noqa: F821
        return self._read_line()

    def _read_line(self):
        deadline = time.monotonic() + self.timeout
        out, err = self.proc.stdout.fileno(), self.proc.stderr.fileno()
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SolutionError("no answer within %g s" % self.timeout)  # noqa: F821
            ready, _, _ = select.select([out, err], [], [], left)
            if err in ready:
                chunk = os.read(err, 65536)
                self.errors = (self.errors + chunk)[-2000:]
            if out in ready:
                chunk = os.read(out, 65536)
                if not chunk:
                    raise SolutionError("the solution's process ended without answering%s" % self.last_error())  # noqa: F821
                self.pending += chunk
                if len(self.pending) > MAX_LINE:
                    raise SolutionError("the solution's answer is longer than %d bytes" % MAX_LINE)  # noqa: F821
        line, _, self.pending = self.pending.partition(b"\n")
        return line.decode("utf-8", errors="replace")

    def last_error(self):
        text = self.errors.decode("utf-8", errors="replace").strip().splitlines()
        return (": " + text[-1]) if text else ""

    def close(self):
        if os.getpid() == 1:  # init of the sandbox's pid namespace: every other process in it is the solution's
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                pass
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                try:
                    if os.waitpid(-1, os.WNOHANG) == (0, 0):
                        time.sleep(0.002)
                except ChildProcessError:
                    break
        else:  # unisolated: the solution's session only
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                pipe.close()
            except OSError:
                pass


def _rebuild(reply):
    """The solution's exception as the first built-in exception class in its class's ancestry."""
    message = reply.get("message") if isinstance(reply.get("message"), str) else ""
    names = reply.get("raised") if isinstance(reply.get("raised"), list) else []
    for name in names:
        cls = getattr(builtins, name, None) if isinstance(name, str) else None
        if isinstance(cls, type) and issubclass(cls, Exception):
            try:
                return cls(message)
            except Exception:  # noqa: BLE001 - a class that does not take one message
                break
    return SolutionError("the solution raised %s" % ((names or ["?"])[0],))  # noqa: F821


def write_back(old, new):
    """The call's effect on a mutable argument, made on the grader's own object."""
    if type(old) is list and type(new) is list or type(old) is bytearray and type(new) is bytearray:
        old[:] = new
    elif type(old) is dict and type(new) is dict or type(old) is set and type(new) is set:
        old.clear()
        old.update(new)


def note(exc):
    text = "%s: %s" % (type(exc).__name__, exc) if str(exc) else type(exc).__name__
    text = repr(text)[1:-1]  # one line, whatever the solution put in its message
    return text[:MAX_NOTE] + ("..." if len(text) > MAX_NOTE else "")


def run_check(task, check, solution):
    function = task["function"]

    def proxy(*args, **kwargs):
        return solution.call(args, kwargs)

    proxy.__name__ = function
    if task["mode"] == "tests":
        name, source = check
        namespace = {"__builtins__": builtins, function: proxy}
        exec(compile(source, "test_solution.py", "exec"), namespace)
        namespace[name]()
        return True
    call, expected = check
    got = eval(compile(call, "example", "eval"), {"__builtins__": builtins, function: proxy})
    want = ast.literal_eval(expected)
    if not same(got, want):  # noqa: F821 - prepended from codec.py
        raise AssertionError("got %r, expected %s" % (got, expected))
    return True


def main():
    not_dumpable()
    marker = sys.stdin.readline().strip()
    task = json.loads(sys.stdin.readline())
    sys.stdin.close()
    results = {}
    deadline = time.monotonic() + task["budget"]
    solution = None
    for check in task["checks"]:
        left = deadline - time.monotonic()
        if left <= 0:  # print a complete result before the sandbox's clock runs out
            results[check[0]] = False
            print("FAIL %s: no time left (the checks before it used the grading budget)" % check[0])
            continue
        try:
            if solution is None:
                solution = Solution(task["server"], task["function"], left)
            solution.load(min(task["call_timeout"], left))
            results[check[0]] = run_check(task, check, solution)
            print("PASS %s" % check[0])
        except BaseException as exc:  # noqa: BLE001 - whatever happened, this check failed
            results[check[0]] = False
            print("FAIL %s: %s" % (check[0], note(exc)))
            if isinstance(exc, SolutionError) and solution is not None:  # noqa: F821 - its process is unusable
                solution.close()
                solution = None
        sys.stdout.flush()
    if solution is not None:
        solution.close()
    print("passed %d of %d" % (sum(results.values()), len(results)))
    print(marker + json.dumps(results))
    sys.stdout.flush()


if __name__ == "__main__":  # started with python3 -I -c
    main()
