"""The sandbox against an attack suite: each attack is stopped, the result says what stopped it, nothing leaks.

The same attacks run as tool calls inside an episode in tests/test_agentic_judge.py (recorded, run goes on).
"""

import os
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

from multiagent_rl.tools import sandbox as sandbox_mod
from multiagent_rl.tools.sandbox import Sandbox, SandboxConfig, SandboxUnavailable, Workspace, WorkspaceEscape, cgroups
from multiagent_rl.tools.sandbox.workspace import DEFAULT_DISK_MB, DEFAULT_MAX_FILES

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
        [sys.executable, "-c", "from multiagent_rl.tools.sandbox import Sandbox, Workspace\n"
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


# -- a hostile workspace: what a command leaves behind must never block, break or fool the host ------------------


def finishes(fn, seconds: float = 5.0):
    """``fn()``'s result, asserting it returns (or raises) within ``seconds``: host-side code must never block on
    what a command left in the workspace."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"the host blocked for over {seconds} s"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def test_fifos_sockets_and_folders_in_place_of_files_never_block_the_hosts_reads_and_writes(ws):
    ws.write("solution.py", "x = 1\n")
    r = run(ws, "import os, socket\nos.remove('solution.py'); os.mkfifo('solution.py'); os.mkfifo('notes.txt')\n"
                "socket.socket(socket.AF_UNIX).bind('sock'); os.mkdir('folder'); os.symlink('notes.txt', 'link')")
    assert r.ok, r
    for name in ["solution.py", "notes.txt", "sock", "folder"]:
        with pytest.raises(OSError, match="not a regular file"):
            finishes(lambda: ws.read(name))
    for name in ["solution.py", "sock"]:  # writing opens for write: a FIFO without a reader, a socket
        with pytest.raises(OSError, match="not a regular file"):
            finishes(lambda: ws.write(name, "y = 2\n"))
    with pytest.raises(WorkspaceEscape, match="symbolic link"):
        finishes(lambda: ws.read("link"))
    assert run(ws, "print('next')").stdout == "next\n"


def test_a_tree_deeper_than_the_recursion_limit_is_listed_used_and_removed(ws):
    r = run(ws, "import os\nfor i in range(1100):\n    os.mkdir('d'); os.chdir('d')\nopen('deep.txt', 'w').write('x')")
    assert r.ok, r
    assert finishes(ws.files) == []  # the file is below the listing's depth cap
    assert "listing stopped" in finishes(ws.listing)
    assert run(ws, "print('next')").stdout == "next\n"
    root = ws.root
    finishes(ws.cleanup)
    assert not root.exists()


def test_a_path_longer_than_path_max_breaks_no_later_command_and_is_removed():
    ws = Workspace(tempfile.mkdtemp(dir="/tmp"))  # a folder of the user's: no tmpfs, removed by hand below
    os.chmod(ws.root, 0o755)
    code = "import os\nname = 'n' * 250\nfor i in range(20):\n    os.mkdir(name); os.chdir(name)\nopen('f', 'w').write('x')"
    try:
        assert run(ws, code).ok
        assert run(ws, "print('next')").stdout == "next\n"
        assert finishes(ws.files) == ["/".join(["n" * 250] * 20 + ["f"])]
    finally:
        finishes(lambda: Workspace(ws.root, owned=True).cleanup())
    assert not ws.root.exists()


def test_chmod_0_of_the_workspace_does_not_lock_out_later_commands(ws):
    assert run(ws, "import os; os.chmod('/workspace', 0)").ok
    assert run(ws, "print('next')").stdout == "next\n"


def test_a_flood_of_files_stops_at_the_inode_quota_and_the_listing_is_capped(ws):
    code = ("n = 0\ntry:\n    while n < 20000:\n        open(f'f{n}', 'w').close(); n += 1\nexcept OSError as e:\n"
            "    print('stopped', e.strerror)\nprint(n)")
    r = run(ws, code)
    created = int(r.stdout.split()[-1])
    if os.geteuid() == 0:
        assert created < DEFAULT_MAX_FILES and "No space left" in r.stdout
    assert len(finishes(ws.files)) <= 2000 and len(os.listdir(ws.root)) <= max(created, 0)


def test_commands_in_a_huge_folder_do_not_stall_the_event_loop():
    """A folder of the user's (no inode quota) with 30,000 files: host-side walks run off the event loop."""
    import asyncio

    root = tempfile.mkdtemp(dir="/tmp")
    os.chmod(root, 0o755)
    for i in range(30_000):
        open(os.path.join(root, f"f{i}"), "w").close()
    ws = Workspace(root)

    async def main():
        gaps, stop = [], asyncio.Event()

        async def ticker():
            last = time.perf_counter()
            while not stop.is_set():
                await asyncio.sleep(0.01)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        tick = asyncio.ensure_future(ticker())
        sandbox = Sandbox(ws, SandboxConfig(max_files=100_000, disk_mb=1024))
        for _ in range(2):
            await sandbox.run(["true"])
        stop.set()
        await tick
        return max(gaps)

    try:
        assert asyncio.run(main()) < 0.5
    finally:
        Workspace(root, owned=True).cleanup()


def test_a_newline_in_a_file_name_cannot_forge_a_line_of_the_listing(ws):
    assert run(ws, "open('a\\nsolution_fake.py', 'w').close(); open('ok.py', 'w').close()").ok
    assert "solution_fake.py" not in "\n".join(ws.files()).splitlines()
    assert ws.files() == [repr("a\nsolution_fake.py"), "ok.py"]


# -- memory and disk are bounded per sandbox, not per process ----------------------------------------------------

needs_cgroup = pytest.mark.skipif(cgroups.support().version is None, reason="needs root and a memory control group")


def shmem_mb() -> int:
    for line in open("/proc/meminfo"):
        if line.startswith("Shmem:"):
            return int(line.split()[1]) // 1024
    return 0


SHM_HOG = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmdt.argtypes = [ctypes.c_void_p]
held = 0
for i in range(64):
    segment = libc.shmget(0, 16 << 20, 0o1000 | 0o600)
    if segment < 0:
        break
    address = libc.shmat(segment, None, 0)
    ctypes.memset(address, 1, 16 << 20)
    libc.shmdt(ctypes.c_void_p(address))
    held += 16
    print('held', held, flush=True)
"""


@needs_cgroup
def test_sysv_shared_memory_counts_against_the_sandbox_and_is_freed_after(ws):
    before = shmem_mb()
    r = run(ws, SHM_HOG, memory_mb=128)
    held = [int(line.split()[1]) for line in r.stdout.splitlines()]
    assert r.killed == "memory" and max(held) <= 128 and r.peak_memory_mb <= 128
    deadline = time.time() + 5
    while shmem_mb() > before + 32 and time.time() < deadline:
        time.sleep(0.1)  # the IPC namespace's segments go with it, asynchronously
    assert shmem_mb() <= before + 32


@needs_cgroup
def test_the_memory_of_many_processes_counts_together(ws):
    code = ("import os, time\nfor i in range(6):\n    if os.fork() == 0:\n        x = bytearray(100 << 20)\n"
            "        time.sleep(3); os._exit(0)\nheld = sum(os.wait()[1] == 0 for i in range(6))\nprint('held', held)")
    r = run(ws, code, memory_mb=256, timeout=15)
    assert r.killed == "memory" and int(r.stdout.split()[1]) < 6 and r.peak_memory_mb <= 256


@needs_cgroup
def test_memfd_written_without_mapping_counts(ws):
    code = ("import os\nfds = []\nfor i in range(24):\n    fd = os.memfd_create(f'm{i}')\n"
            "    os.write(fd, b'x' * (15 << 20)); fds.append(fd)\n    print('held', 15 * (i + 1), flush=True)\nprint('DONE')")
    r = run(ws, code, memory_mb=128)
    assert "DONE" not in r.stdout and r.killed == "memory"


def test_no_user_namespace_and_so_no_private_tmpfs_inside(ws):
    r = Sandbox(ws).run_sync(["unshare", "-Urm", "sh", "-c", "mount -t tmpfs none /workspace && for i in 1 2 3 4 5 6;"
                              " do head -c 15000000 /dev/zero > /workspace/$i; done && echo HELD"])
    assert "HELD" not in r.stdout and r.returncode != 0


def test_the_oom_killer_takes_a_sandbox_before_the_trainer(ws):
    r = run(ws, "print(open('/proc/self/oom_score_adj').read())")
    assert r.stdout.strip() == "1000"


@pytest.mark.skipif(os.geteuid() != 0, reason="the kernel-enforced workspace quota (a tmpfs) needs root")
def test_fallocate_cannot_fill_the_hosts_disk(ws):
    code = ("import os\nfor i in range(128):\n    fd = os.open(f'f{i}', os.O_CREAT | os.O_WRONLY)\n    try:\n"
            "        os.posix_fallocate(fd, 0, 16 << 20)\n    except OSError as e:\n        print('stopped at', i, e.strerror)"
            "\n        break\n    finally:\n        os.close(fd)")
    r = run(ws, code)
    assert "No space left" in r.stdout
    assert ws.usage()[0] <= DEFAULT_DISK_MB << 20


def test_a_workspace_that_is_not_its_own_filesystem_has_its_quota_checked_after_each_command():
    root = tempfile.mkdtemp(dir="/tmp")
    os.chmod(root, 0o755)
    ws = Workspace(root)
    try:
        r = Sandbox(ws, SandboxConfig(disk_mb=4)).run_sync(
            ["python3", "-c", "for i in range(3): open(f'f{i}', 'wb').write(b'x' * (2 << 20))"])
        assert r.killed == "disk quota" and not r.ok
    finally:
        Workspace(root, owned=True).cleanup()


def test_cleanup_leaves_nothing_on_disk_mounted_or_in_control_groups():
    ws = Workspace.create()
    junk = ("import os\nos.mkfifo('fifo'); os.makedirs('a/b/c'); open('a/b/c/f', 'w').write('x')\n"
            "os.chmod('a/b', 0); os.symlink('/etc', 'etc')")
    assert run(ws, junk).ok
    root = ws.root
    ws.cleanup()
    assert not root.exists() and str(root) not in open("/proc/mounts").read()
    support = cgroups.support()
    if support.memory is not None:
        assert list(support.memory.glob("cmd-*")) == []


def test_the_docs_table_of_limits_is_the_codes():
    docs = (Path(__file__).parent.parent / "docs" / "agentic_judge.md").read_text()
    assert sandbox_mod.limits_table() in docs


# -- the kernel keyrings are not namespaced -----------------------------------------------------------------------


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="syscall numbers of x86-64")
def test_the_trainers_session_keyring_is_out_of_reach(ws):
    """A trainer with a key in its session keyring runs a command that tries to read and overwrite it."""
    import subprocess
    import sys

    attack = ("import ctypes, sys\nlibc = ctypes.CDLL(None, use_errno=True)\nserial = int(sys.argv[1])\n"
              "buf = ctypes.create_string_buffer(256)\n"
              "print('read', libc.syscall(250, 11, serial, buf, 256), buf.value)\n"
              "print('update', libc.syscall(250, 2, serial, b'overwritten', 11))\n"
              "try:\n    print('keys', open('/proc/keys').read())\nexcept OSError as e:\n    print('keys', e)")
    trainer = f"""
import ctypes, os
from multiagent_rl.tools.sandbox import Sandbox, Workspace
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall(250, 1, None)  # KEYCTL_JOIN_SESSION_KEYRING: this process's own session keyring, as a login has
serial = libc.syscall(248, b"user", b"mrl-test-key", b"secret-payload", 14, -3)
assert serial > 0, os.strerror(ctypes.get_errno())
with Workspace.create() as ws:
    r = Sandbox(ws).run_sync(["python3", "-c", {attack!r}, str(serial)])
print(r.stdout)
buf = ctypes.create_string_buffer(256)
libc.syscall(250, 11, serial, buf, 256)
print("after", buf.value)
libc.syscall(250, 21, serial)  # KEYCTL_INVALIDATE
"""
    out = subprocess.run([sys.executable, "-c", trainer], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "secret-payload" not in out.stdout.split("after")[0] and "mrl-test-key" not in out.stdout
    assert "update -1" in out.stdout and "after b'secret-payload'" in out.stdout


# -- sandbox uids are unique across the machine, not only across this process's pids -----------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="separate sandbox uids (and pid namespaces) need root")
def test_two_trainers_that_are_both_pid_1_get_their_own_uids_and_process_budgets():
    import subprocess
    import sys

    trainer = """
import os, sys
from multiagent_rl.tools.sandbox import Sandbox, SandboxConfig, Workspace
with Workspace.create() as ws:
    r = Sandbox(ws, SandboxConfig(max_processes=8, timeout=8)).run_sync(["sh", "-c", sys.argv[1]])
out = r.stdout.split() or ["none"]
print("pid", os.getpid(), "uid", out[0], "last", out[-1], "killed", r.killed)
"""
    holder = "id -u; for i in 1 2 3 4 5 6 7 8 9 10; do sleep 4 & done; wait; echo held"
    starter = "id -u; echo started"
    ns = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", trainer]
    first = subprocess.Popen(ns + [holder], stdout=subprocess.PIPE, text=True)
    time.sleep(1.5)  # the first holds all its processes now
    second = subprocess.run(ns + [starter], capture_output=True, text=True, timeout=60)
    first_out = first.communicate(timeout=60)[0]
    assert second.stdout.split()[:2] == ["pid", "1"] and first_out.split()[:2] == ["pid", "1"], (first_out, second)
    assert second.stdout.split()[3] != first_out.split()[3]  # different uids
    assert second.stdout.split()[5] == "started", second
