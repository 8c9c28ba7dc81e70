"""Sandboxes: where every command an agent's tool runs is executed.

A [`Workspace`][multiagent_rl.tools.sandbox.workspace.Workspace] is one episode's folder; a
[`Sandbox`][multiagent_rl.tools.sandbox.Sandbox] runs commands in it under
`bubblewrap <https://github.com/containers/bubblewrap>`_ (Debian/Ubuntu package ``bubblewrap``). The threat model:
the code is written by a model optimised to raise its reward, so it is hostile. It must not read or harm the host,
exhaust it, freeze the trainer, or forge its reward.

- its own network, pid, IPC, UTS and user namespaces, with no further user namespaces inside (so no tmpfs or
  mount of its own); the whole namespace dies with the command, so nothing it started outlives the call;
- a read-only ``/usr`` and the workspace, mounted at ``/workspace``, as the only writable place; nothing else of
  the host (no ``/etc``, no home, no ``/tmp``, no ``/proc/keys``) and no environment variables except ``PATH``,
  ``HOME`` and ``LANG``;
- a seccomp filter ([`seccomp`][multiagent_rl.tools.sandbox.seccomp]) refusing the kernel keyrings (shared with the
  trainer otherwise), ``ptrace`` and a few large attack surfaces;
- per sandbox, run as root: a memory control group of ``memory_mb`` counting every page its processes touch (shared
  memory, memfd and kernel memory included), a process count, ``oom_score_adj`` 1000 so the kernel's OOM killer
  takes a sandbox before the trainer, and a workspace that is its own filesystem of ``disk_mb`` and ``max_files``
  inodes ([`cgroups`][multiagent_rl.tools.sandbox.cgroups], [`Workspace.create`][multiagent_rl.tools.sandbox.workspace.Workspace.create]);
- per process: CPU seconds, address space, file size and open files (``prlimit``); a wall-clock timeout that kills
  the whole sandbox; a cap on the captured output (past it the command is killed, not merely truncated).

Without root, memory is bounded per process only and the disk quota is measured after each command (a result
then says ``killed="disk quota"``); docs/agentic_judge.md lists what holds where.
Without bubblewrap a sandbox refuses to start and says how to install it; ``isolation="none"`` runs plain
subprocesses with the same limits, timeout and output cap but **no isolation**, and every result and trace says so
(``CommandResult.isolated`` is False).

```pycon
>>> with Workspace.create() as ws:  # doctest: +SKIP
...     ws.write("hello.py", "print('hi')")
...     result = Sandbox(ws).run_sync(["python3", "hello.py"])
...     result.stdout
'hi\\n'

```
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import seccomp
from .cgroups import CommandGroup
from .config import CommandResult, SandboxConfig, limits_table
from .files import NotARegularFile
from .processes import UID_BASE, OutputCollector, kill_group, kill_uid, reap_uid, slots, threads_of
from .workspace import SANDBOX_HOME, Workspace, WorkspaceEscape

__all__ = ["CommandResult", "NotARegularFile", "SANDBOX_HOME", "Sandbox", "SandboxConfig", "SandboxUnavailable",
           "UID_BASE", "Workspace", "WorkspaceEscape", "bwrap_available", "check_bwrap", "limits_table"]

logger = logging.getLogger(__name__)

INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`; Fedora: `dnf install bubblewrap`), or set "
    "the sandbox's isolation='none' to run commands as plain subprocesses with limits but NO isolation "
    "(only for code you trust)"
)


class SandboxUnavailable(RuntimeError):
    """Raised when commands cannot be isolated as configured (bubblewrap missing or refused to start)."""


class Sandbox:
    """Runs commands in a workspace under the configured isolation and limits.

    Commands are argv lists; ``python3`` means an interpreter the sandbox can see (``/usr/bin/python3``, or
    the running interpreter's own installation, mounted read-only). ``run`` is async (episodes run
    concurrently); ``run_sync`` is for scripts and notebooks. ``mounts`` adds read-only folders at chosen places
    (``{"/task": host_folder}``).
    """

    def __init__(self, workspace: Workspace | str | Path, config: SandboxConfig | dict | None = None,
                 mounts: dict[str, str | Path] | None = None):
        self.workspace = workspace if isinstance(workspace, Workspace) else Workspace(workspace)
        self.config = config if isinstance(config, SandboxConfig) else SandboxConfig(**(config or {}))
        self.mounts = {str(k): str(v) for k, v in (mounts or {}).items()}
        self.isolated = self.config.isolation == "bwrap"
        if os.geteuid() == 0:
            _check_reachable_by_others(self.workspace.root)
        if self.isolated:
            check_bwrap()
        else:
            _warn_unisolated()

    async def run(self, argv: list[str], *, stdin: str | None = None, timeout: float | None = None) -> CommandResult:
        """Run ``argv`` in the workspace and return what it did; never raises for what the command does."""
        if not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError(f"a command is a non-empty list of strings, got {argv!r}")
        cfg = self.config
        argv = [_python() if a == "python3" and i == 0 else a for i, a in enumerate(argv)]
        async with slots(cfg.max_concurrent):
            uid = await asyncio.to_thread(self.workspace.prepare)
            group = CommandGroup.create(cfg.memory_mb << 20, cfg.max_processes)
            filter_fd = seccomp.filter_fd() if self.isolated and seccomp.supported() else None
            try:
                full = group.enter() + self._limits(uid, group) + (self._bwrap(argv, filter_fd) if self.isolated
                                                                    else argv)
                started = time.perf_counter()
                loop = asyncio.get_running_loop()
                transport, output = await loop.subprocess_exec(
                    lambda: OutputCollector(cfg.max_output_bytes), *full,
                    stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=() if filter_fd is None else (filter_fd,),
                    cwd=self.workspace.root, env=self._env(), start_new_session=True,
                )
            finally:
                if filter_fd is not None:
                    os.close(filter_fd)
            try:
                killed = await self._wait(transport, output, stdin, timeout or cfg.timeout, uid)
            finally:
                transport.close()
                oom, peak = group.oom_killed(), group.peak_bytes()
                await asyncio.to_thread(group.remove)
                if uid is not None:
                    await reap_uid(uid)
            returncode = transport.get_returncode()
            if killed is None and not self.workspace.quota_mounted:
                killed = await asyncio.to_thread(self._over_quota)
        if oom and killed is None:
            killed = "memory"
        elif killed is None and returncode is not None and returncode < 0:
            killed = f"signal {signal.Signals(-returncode).name}"
        elif killed is None and self.isolated and returncode is not None and returncode > 128:
            # bubblewrap reports its child's death by signal N as exit status 128 + N
            with contextlib.suppress(ValueError):
                killed = f"signal {signal.Signals(returncode - 128).name}"
        return CommandResult(
            command=list(argv), returncode=returncode, stdout=output.text(1), stderr=output.text(2),
            duration=time.perf_counter() - started, killed=killed, isolated=self.isolated,
            peak_memory_mb=None if peak is None else round(peak / 2**20, 1),
        )

    def run_sync(self, argv: list[str], **kwargs) -> CommandResult:
        """[`run`][multiagent_rl.tools.sandbox.Sandbox.run] from synchronous code (not from inside a running event loop)."""
        return asyncio.run(self.run(argv, **kwargs))

    def _over_quota(self) -> str | None:
        cfg = self.config
        size, entries = self.workspace.usage(limit=cfg.max_files + 1)
        return "disk quota" if size > cfg.disk_mb << 20 or entries > cfg.max_files else None

    # -- building the command --------------------------------------------------------------
    def _limits(self, uid: int | None, group: CommandGroup) -> list[str]:
        cfg = self.config
        nproc = cfg.max_processes + (0 if uid is not None else threads_of(os.getuid()))
        limits = ["prlimit", f"--cpu={cfg.cpu_seconds}", f"--as={cfg.memory_mb << 20}", f"--nproc={nproc}",
                  f"--fsize={cfg.max_file_mb << 20}", f"--nofile={cfg.max_open_files}", "--core=0", "--"]
        if uid is None:
            return limits
        # Dropping root before bubblewrap starts: root is exempt from the process limit, and bubblewrap then maps
        # this uid into its own user namespace (no setuid binary involved).
        return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"] + limits

    def _bwrap(self, argv: list[str], filter_fd: int | None) -> list[str]:
        # --as-pid-1: no extra init process, so bubblewrap's only child is the command and it reaps it (an init
        # outlives bubblewrap's exit as a zombie of the host's init, counted against the process limit). It also
        # makes the command the namespace's init, which its children cannot kill or stop.
        cmd = ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--as-pid-1", "--die-with-parent",
               "--new-session", "--clearenv",
               "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", SANDBOX_HOME,
               "--setenv", "LANG", "C.UTF-8",
               "--ro-bind", "/usr", "/usr"]
        for name in ("bin", "lib", "lib32", "lib64", "sbin"):
            host = Path("/") / name
            if host.is_symlink():  # merged-/usr systems: /bin -> usr/bin
                cmd += ["--symlink", os.readlink(host), str(host)]
            elif host.is_dir():
                cmd += ["--ro-bind", str(host), str(host)]
        for path in [*_interpreter_binds(), *self.config.ro_binds]:
            cmd += ["--ro-bind", path, path]
        cmd += ["--proc", "/proc"]
        for path in _KEYRING_FILES:  # the keyrings are not namespaced: not even their names are shown
            cmd += ["--ro-bind", "/dev/null", path]
        cmd += ["--dev", "/dev", "--bind", str(self.workspace.root), SANDBOX_HOME]
        for inside, host in self.mounts.items():
            cmd += ["--ro-bind", host, inside]
        cmd += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", SANDBOX_HOME]
        if filter_fd is not None:
            cmd += ["--seccomp", str(filter_fd)]
        return cmd + ["--"] + argv

    def _env(self) -> dict[str, str]:
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
        if not self.isolated:
            env["HOME"] = str(self.workspace.root)
        return env

    # -- running it ------------------------------------------------------------------------
    async def _wait(self, transport, output: OutputCollector, stdin: str | None, timeout: float,
                    uid: int | None) -> str | None:
        """Wait for the command to end, hit the output cap or run out of time; kill what is left either way."""
        if stdin is not None:
            pipe = transport.get_pipe_transport(0)
            pipe.write(stdin.encode())
            pipe.close()
        exited = asyncio.ensure_future(output.exited.wait())
        capped = asyncio.ensure_future(output.over_cap.wait())
        done, _ = await asyncio.wait([exited, capped], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        killed = None if exited in done else ("output" if capped in done else "timeout")
        if killed and uid is not None:
            # The command first (everything of the workspace's uid but bubblewrap itself), so that bubblewrap reaps
            # its child and exits: killed first, it would leave its child a zombie for the host's init to reap, and
            # zombies count against the uid's process limit.
            kill_uid(uid, spare=transport.get_pid())
            await asyncio.wait([exited], timeout=0.5)
        # Killing the process group takes bubblewrap down, and its namespace's processes with it; unisolated,
        # it takes the command's group (background jobs included) down.
        kill_group(transport.get_pid())
        await exited
        capped.cancel()
        # Output still in flight gets a moment; a process that left the group (possible only unisolated) and
        # holds the pipes open is not waited for.
        await asyncio.wait([asyncio.ensure_future(output.closed.wait())], timeout=1.0)
        return killed


_KEYRING_FILES = [p for p in ("/proc/keys", "/proc/key-users") if os.path.exists(p)]


# -- host checks and helpers -------------------------------------------------------------------
_BWRAP_OK: bool | None = None


def check_bwrap() -> None:
    """Raise [`SandboxUnavailable`][multiagent_rl.tools.sandbox.SandboxUnavailable] (with how to fix it) unless bubblewrap can
    start a sandbox here."""
    global _BWRAP_OK
    if _BWRAP_OK:
        return
    needed = ("bwrap", "prlimit") + (("setpriv",) if os.geteuid() == 0 else ())
    missing = [tool for tool in needed if not shutil.which(tool)]
    if missing:
        raise SandboxUnavailable(f"cannot isolate tool commands: {', '.join(missing)} not found; {INSTALL_HINT}")

    probe = Sandbox.__new__(Sandbox)
    probe.config, probe.isolated, probe.mounts = SandboxConfig(), True, {}
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        probe.workspace = Workspace(tmp)
        uid = probe.workspace.prepare()
        try:
            argv = probe._limits(uid, CommandGroup()) + probe._bwrap(["true"], None)
            result = subprocess.run(argv, capture_output=True, text=True, env=probe._env(), cwd=tmp)
        finally:
            probe.workspace.cleanup()
    if result.returncode != 0:
        raise SandboxUnavailable(
            f"bubblewrap is installed but cannot start a sandbox here ({result.stderr.strip() or result.returncode}); "
            "it needs unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1; in Docker, "
            f"--security-opt seccomp=unconfined or a privileged container). Otherwise {INSTALL_HINT}"
        )
    _BWRAP_OK = True


def bwrap_available() -> bool:
    """Whether [`check_bwrap`][multiagent_rl.tools.sandbox.check_bwrap] passes."""
    try:
        check_bwrap()
    except SandboxUnavailable:
        return False
    return True


def _check_reachable_by_others(root: Path) -> None:
    """Run as root, commands drop to an unprivileged uid, which must be able to enter every folder above the
    workspace; a private parent (pytest's ``tmp_path``, a ``TMPDIR`` of mode 0700) would make every command fail."""
    for folder in root.parents:  # the workspace itself is set to 755 before every command
        if not folder.stat().st_mode & stat.S_IXOTH:
            raise SandboxUnavailable(
                f"the workspace {root} is not reachable by the sandbox's unprivileged user: {folder} is mode "
                f"{stat.S_IMODE(folder.stat().st_mode):o} (others may not enter it). Create workspaces under a folder "
                "everyone may enter (Workspace.create(parent=...), or TMPDIR=/tmp), or `chmod o+x` that folder."
            )


_WARNED_UNISOLATED = False


def _warn_unisolated() -> None:
    global _WARNED_UNISOLATED
    if not _WARNED_UNISOLATED:
        logger.warning("sandbox isolation='none': tool commands run as plain subprocesses on this host with resource "
                       "limits but NO isolation (network, files and processes are reachable); results are marked "
                       "isolated=False")
        _WARNED_UNISOLATED = True


def _python() -> str:
    """An interpreter the sandbox can see: the system's, else the running one's installation (bound read-only)."""
    if Path("/usr/bin/python3").exists():
        return "/usr/bin/python3"
    return str(Path(sys.base_prefix) / "bin" / "python3")


def _interpreter_binds() -> list[str]:
    if Path("/usr/bin/python3").exists() or sys.base_prefix.startswith("/usr/"):
        return []
    return [str(Path(sys.base_prefix).resolve())]



