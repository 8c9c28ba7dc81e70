"""The sandbox against an attack suite: each attack is stopped, the result says what stopped it, nothing leaks.

The same attacks run as tool calls inside an episode in tests/test_agentic_judge.py (recorded, run goes on).
"""

import os
import socket
import threading
import time

import pytest

from multiagent_rl import sandbox as sandbox_mod
from multiagent_rl.sandbox import Sandbox, SandboxConfig, SandboxUnavailable, Workspace, WorkspaceEscape

pytestmark = pytest.mark.skipif(not sandbox_mod.bwrap_available(), reason="bubblewrap cannot start here (CI installs it)")

MARK = "31337.25"  # a sleep duration no other process on the machine uses: finds leftovers by command line


@pytest.fixture
def ws():
    with Workspace.create() as w:
        yield w


def run(ws, code: str, **cfg) -> sandbox_mod.CommandResult:
    return Sandbox(ws, SandboxConfig(**cfg)).run_sync(["python3", "-c", code])


def leftovers(marker: str = MARK) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmd and "pytest" not in cmd:
            found.append(cmd)
    return found


def test_ordinary_command_works_in_the_workspace(ws):
    ws.write("pkg/data.txt", "41")
    r = run(ws, "import os; print(int(open('pkg/data.txt').read()) + 1, os.getcwd()); open('out.txt', 'w').write('x')")
    assert r.ok and r.isolated and r.stdout.split() == ["42", "/workspace"]
    assert ws.read("out.txt") == "x" and ws.files() == ["out.txt", "pkg/data.txt"]


def test_reading_system_secrets_and_the_host_home_fails(ws):
    code = f"""
import os
for p in ['/etc/shadow', '/etc/passwd', {str(os.path.expanduser('~'))!r}, {os.path.abspath(__file__)!r}]:
    try:
        open(p).read() if not os.path.isdir(p) else os.listdir(p)
        print('READ', p)
    except OSError as e:
        print('blocked', p, type(e).__name__)
"""
    r = run(ws, code)
    assert r.ok and "READ" not in r.stdout and r.stdout.count("blocked") == 4


def test_writing_outside_the_workspace_fails(ws, tmp_path):
    outside = tmp_path / "planted.txt"
    code = f"""
for p in ['/usr/planted', '/planted', '/dev/planted', {str(outside)!r}, '/workspace/../planted']:
    try:
        open(p, 'w').write('x'); print('WROTE', p)
    except OSError as e:
        print('blocked', p, type(e).__name__)
"""
    r = run(ws, code)
    assert r.ok and "WROTE" not in r.stdout and r.stdout.count("blocked") == 5
    assert not outside.exists() and not os.path.exists("/usr/planted")


def test_symlink_and_dotdot_escapes_fail_in_the_sandbox_and_on_the_host(ws):
    secret = ws.root.parent / f"secret-{os.getpid()}.txt"
    secret.write_text("host secret")
    try:
        code = f"""
import os
os.symlink('/etc/passwd', 'to_passwd'); os.symlink('..', 'up'); os.symlink({str(secret)!r}, 'to_secret')
for p in ['to_passwd', 'up/{secret.name}', 'to_secret', '../{secret.name}', '../../etc/passwd']:
    try:
        print('READ', p, open(p).read())
    except OSError as e:
        print('blocked', p, type(e).__name__)
"""
        r = run(ws, code)
        assert r.ok and "host secret" not in r.stdout and r.stdout.count("blocked") == 5
        # The host-side file tools refuse the planted links and `..` instead of following them.
        for path in ["to_passwd", f"up/{secret.name}", "to_secret", f"../{secret.name}", "/etc/passwd"]:
            with pytest.raises(WorkspaceEscape):
                ws.read(path)
    finally:
        secret.unlink()


class Listener:
    """A TCP server on the host's loopback that records whether anyone connected or sent a byte."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            conn.close()

    def close(self):
        self.stop.set()
        self.thread.join()
        self.sock.close()


def test_network_is_unreachable_loopback_and_outside(ws):
    listener = Listener()
    try:
        code = f"""
import socket
for addr in [('127.0.0.1', {listener.port}), ('1.1.1.1', 80), ('8.8.8.8', 53)]:
    try:
        s = socket.create_connection(addr, timeout=2); s.sendall(b'leak'); print('CONNECTED', addr)
    except OSError as e:
        print('blocked', addr, type(e).__name__)
try:
    socket.getaddrinfo('pypi.org', 443); print('RESOLVED')
except OSError as e:
    print('blocked dns', type(e).__name__)
"""
        r = run(ws, code)
        time.sleep(0.5)
    finally:
        listener.close()
    assert r.ok and "CONNECTED" not in r.stdout and "RESOLVED" not in r.stdout and r.stdout.count("blocked") == 4
    assert listener.connections == 0


def test_fork_bomb_is_stopped_by_the_process_limit(ws):
    code = """
import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(%s); os._exit(0)
        n += 1
except OSError as e:
    print('stopped after', n, type(e).__name__)
""" % MARK
    r = run(ws, code, max_processes=16, timeout=10)
    assert r.ok, r
    assert int(r.stdout.split()[2]) < 16
    assert leftovers() == []


def test_shell_fork_bomb_is_killed_with_its_whole_tree(ws):
    r = Sandbox(ws, SandboxConfig(timeout=2, max_processes=24)).run_sync(
        ["sh", "-c", f"b() {{ sleep {MARK} & b | b & }}; b; wait"])
    assert r.killed == "timeout" and r.duration < 6
    time.sleep(0.3)
    assert leftovers() == []


def test_infinite_loop_is_stopped_by_the_cpu_limit(ws):
    r = run(ws, "while True: pass", cpu_seconds=1, timeout=30)
    assert r.killed in ("signal SIGXCPU", "signal SIGKILL") and r.duration < 10


def test_sleeping_forever_is_stopped_by_the_wall_clock(ws):
    r = run(ws, "import time; time.sleep(1000)", timeout=1)
    assert r.killed == "timeout" and r.duration < 4


def test_ten_gigabytes_are_refused(ws):
    r = run(ws, "x = bytearray(10 * 2**30); print('ALLOCATED')", memory_mb=512)
    assert "ALLOCATED" not in r.stdout and "MemoryError" in r.stderr


def test_a_gigabyte_on_stdout_is_cut_and_the_writer_killed(ws):
    code = "import sys\nchunk = b'x' * 2**20\nfor _ in range(1024): sys.stdout.buffer.write(chunk)\nprint('DONE')"
    r = run(ws, code, max_output_bytes=10_000, timeout=60)
    assert r.killed == "output" and len(r.stdout) <= 10_000 and r.duration < 10


def test_a_file_past_the_size_limit_is_stopped(ws):
    # Python ignores SIGXFSZ, so its write fails; a plain program is killed by the signal.
    r = run(ws, "f = open('big', 'wb')\nfor _ in range(64): f.write(b'x' * 2**20)\nprint('DONE')", max_file_mb=2)
    assert "DONE" not in r.stdout and "File too large" in r.stderr
    r = Sandbox(ws, SandboxConfig(max_file_mb=2)).run_sync(["sh", "-c", "head -c 67108864 /dev/zero > big2"])
    assert r.killed == "signal SIGXFSZ"
    assert os.path.getsize(ws.resolve("big")) <= 2 << 20 and os.path.getsize(ws.resolve("big2")) <= 2 << 20


def test_a_process_that_ignores_sigterm_is_killed(ws):
    r = Sandbox(ws, SandboxConfig(timeout=1)).run_sync(
        ["sh", "-c", f"trap '' TERM; while true; do sleep {MARK}; done"])
    assert r.killed == "timeout" and r.duration < 4
    time.sleep(0.3)
    assert leftovers() == []


def test_background_process_does_not_outlive_the_call(ws):
    r = Sandbox(ws).run_sync(["sh", "-c", f"(sleep {MARK}; touch late) & echo started"])
    assert r.ok and r.stdout.strip() == "started" and r.duration < 5
    time.sleep(0.3)
    assert leftovers() == [] and "late" not in ws.files()


def test_the_parents_environment_is_not_visible(ws, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-sandbox-test-secret")
    code = f"""
import os
print(sorted(os.environ))
for p in ['/proc/self/environ', '/proc/1/environ', '/proc/{os.getpid()}/environ', '/proc/{os.getppid()}/environ']:
    try:
        print(p, open(p, 'rb').read())
    except OSError as e:
        print('blocked', p, type(e).__name__)
"""
    r = run(ws, code)
    assert r.ok and "sk-sandbox-test-secret" not in r.stdout
    assert r.stdout.splitlines()[0] == str(sorted(["HOME", "LANG", "PATH", "PWD"]))


def test_concurrent_sandboxes_each_get_their_own_process_budget(ws):
    """One sandbox's processes do not count against another's (root runs each slot as its own uid)."""
    import asyncio

    if os.geteuid() != 0:
        pytest.skip("separate process budgets need root (each slot its own uid)")

    async def main():
        with Workspace.create() as a, Workspace.create() as b:
            # alone each needs 15 of its 16 processes (bubblewrap's two, the shell, ten sleeps): together 30
            cfg = SandboxConfig(max_processes=16, max_concurrent=2)
            cmd = ["sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do sleep 1 & done; wait; echo ok"]
            return await asyncio.gather(Sandbox(a, cfg).run(cmd), Sandbox(b, cfg).run(cmd))

    assert [r.stdout.strip() for r in asyncio.run(main())] == ["ok", "ok"]


def test_without_bubblewrap_the_sandbox_refuses_and_says_how_to_install(ws, monkeypatch):
    monkeypatch.setattr(sandbox_mod, "_BWRAP_OK", None)
    real_which = sandbox_mod.shutil.which
    monkeypatch.setattr(sandbox_mod.shutil, "which", lambda name: None if name == "bwrap" else real_which(name))
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        Sandbox(ws)


def test_unisolated_opt_in_keeps_the_limits_and_is_marked(ws, caplog):
    cfg = SandboxConfig(isolation="none", timeout=1, max_output_bytes=4096)
    sb = Sandbox(ws, cfg)
    r = sb.run_sync(["python3", "-c", "import os; print(os.getcwd())"])
    assert r.ok and r.isolated is False and r.stdout.strip() == str(ws.root)
    assert "(not isolated)" in r.summary()
    assert sb.run_sync(["python3", "-c", "import time; time.sleep(100)"]).killed == "timeout"
    assert sb.run_sync(["python3", "-c", "print('x' * 100000)"]).killed == "output"
    assert "MemoryError" in Sandbox(ws, SandboxConfig(isolation="none", memory_mb=512)).run_sync(
        ["python3", "-c", "bytearray(10 * 2**30)"]).stderr


def test_two_processes_never_touch_each_others_sandboxes(ws):
    """Each process has its own sandbox uids: killing and reaping here cannot reach another process's command
    (the ranks of a multi-process run share a machine)."""
    import subprocess
    import sys

    child = subprocess.Popen(
        [sys.executable, "-c", "from multiagent_rl.sandbox import Sandbox, Workspace\n"
         "with Workspace.create() as w:\n"
         "    r = Sandbox(w).run_sync(['sh', '-c', 'sleep 1.5; echo ok'])\n"
         "print(r.stdout.strip(), r.killed)"],
        stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    for _ in range(3):  # each of these is killed, its slot reaped
        assert Sandbox(ws, SandboxConfig(timeout=0.3)).run_sync(["sleep", "5"]).killed == "timeout"
    assert child.communicate(timeout=30)[0].split() == ["ok", "None"]


@pytest.mark.skipif(os.geteuid() != 0, reason="only root drops to an unprivileged uid that must enter the folders")
def test_a_workspace_under_a_private_folder_is_refused_naming_the_folder(tmp_path):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    private.chmod(0o700)
    with Workspace.create(parent=private) as w:
        with pytest.raises(SandboxUnavailable, match=f"{private} is mode 700"):
            Sandbox(w)
        private.chmod(0o711)  # pytest's own tmp_path folders above are private too
        with pytest.raises(SandboxUnavailable, match="is mode 700"):
            Sandbox(w)
