"""One control group per sandboxed command: memory (shared memory, tmpfs and kernel memory included) and process
count bounded for the sandbox as a whole, not per process.

Resource limits (``setrlimit``) count per process: six children of 100 MB each, SysV shared memory detached after
each write, or a ``memfd`` written without ever being mapped escape them. A memory control group charges every
page the sandbox's processes touch, so the kernel stops the sandbox (its own OOM kill, inside the group) before
it reaches the trainer. Needs root and a writable cgroup hierarchy:

- cgroup v1 (``memory`` and ``pids`` hierarchies): a child group of this process's own memory group and one in the
  pids hierarchy;
- cgroup v2: a child of this process's group with the ``memory`` and ``pids`` controllers enabled (where the group
  holds processes, they move to a ``multiagent_rl-host`` leaf first, as container init systems do).

Where neither is available (not root, no delegated hierarchy) [`support`][multiagent_rl.tools.sandbox.cgroups.support]
says why once, and a sandbox's memory is bounded only per process (``memory_mb`` × ``max_processes`` in all).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import itertools
import logging
import os
import secrets
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

ENTER = ('while [ "$1" != -- ]; do echo $$ > "$1" || exit 126; shift; done; shift; '
         'echo 1000 > /proc/self/oom_score_adj; exec "$@"')
"""The shell that starts every sandboxed command: it moves itself into the command's groups before anything else
runs (so no child is ever started outside them) and makes itself the OOM killer's first choice over the trainer
(``oom_score_adj`` 1000, which an unprivileged process can raise but never lower again)."""

_counter = itertools.count()


@dataclass
class Support:
    """What this process can do with control groups."""

    version: int | None  # 1, 2 or None (unavailable)
    reason: str = ""  # why unavailable
    memory: Path | None = None  # the folder new memory groups are made in (v2: memory and pids together)
    pids: Path | None = None  # v1 only: the folder new pids groups are made in (None: no pids hierarchy)


@functools.lru_cache(maxsize=1)
def support() -> Support:
    """Probe once per process: where to make the sandboxes' groups, or why they cannot be made."""
    if os.geteuid() != 0:
        return _unavailable("not root")
    try:
        own = _own_groups()
        mounts = _mounts()
    except OSError as exc:
        return _unavailable(f"cannot read /proc/self/cgroup or mountinfo ({exc})")
    base = f"multiagent_rl-{os.getpid()}-{secrets.token_hex(3)}"
    if "memory" in mounts:  # v1 (or hybrid with the controllers on v1)
        memory = _make(_in_mount(mounts["memory"], own.get("memory")), base)
        pids = _make(_in_mount(mounts["pids"], own.get("pids")), base) if "pids" in mounts else None
        if memory is None:
            return _unavailable("the cgroup v1 memory hierarchy is not writable here")
        found = Support(1, memory=memory, pids=pids)
    elif "" in mounts:
        parent = _v2_parent(_in_mount(mounts[""], own.get("")))
        made = None if parent is None else _make(parent, base)
        if made is None or not _enable(made):
            return _unavailable("cgroup v2 has no memory and pids controllers this process may delegate")
        found = Support(2, memory=made)
    else:
        return _unavailable("no cgroup memory controller is mounted")
    for folder in (found.memory, found.pids):
        if folder is not None:
            _remove_stale(folder.parent, keep=folder)
            atexit.register(_remove_empty, folder)
    return found


def _remove_stale(parent: Path, keep: Path) -> None:
    """Groups left by processes of this machine that died without cleaning up (rmdir removes only empty groups)."""
    for folder in parent.glob("multiagent_rl-*-*"):
        pid = folder.name.split("-")[1]
        if folder != keep and pid.isdigit() and not _alive(int(pid)):
            _remove_empty(folder)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_empty(folder: Path) -> None:
    for child in folder.glob("cmd-*"):
        with contextlib.suppress(OSError):
            child.rmdir()
    with contextlib.suppress(OSError):
        folder.rmdir()


def _unavailable(reason: str) -> Support:
    logger.warning("sandbox: no per-sandbox memory control group (%s): memory is bounded per process only "
                   "(memory_mb x max_processes per sandbox in all; shared memory and memfd are not counted). "
                   "Run as root with a writable cgroup hierarchy for the per-sandbox bound.", reason)
    return Support(None, reason)


def _own_groups() -> dict[str, str]:
    """Controller name ('' for v2) -> this process's group path."""
    out = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            out[c] = path
    return out


def _mounts() -> dict[str, tuple[str, str]]:
    """Controller name ('' for v2) -> (mount point, the group path the mount shows as its root)."""
    out: dict[str, tuple[str, str]] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, right = line.split(" - ", 1)
        fields, (fstype, _, options) = left.split(), right.split()[:3]
        root, point = fields[3], fields[4].replace("\\040", " ")
        if fstype == "cgroup2":
            out.setdefault("", (point, root))
        elif fstype == "cgroup":
            for c in ("memory", "pids"):
                if c in options.split(","):
                    out.setdefault(c, (point, root))
    return out


def _in_mount(mount: tuple[str, str], own: str | None) -> Path:
    point, root = mount
    own = own or "/"
    rel = own[len(root):] if root != "/" and own.startswith(root) else own
    return Path(point) / rel.lstrip("/")


def _make(parent: Path, name: str) -> Path | None:
    path = parent / name
    try:
        path.mkdir(exist_ok=True)
    except OSError:
        return None
    return path


def _v2_parent(own: Path) -> Path | None:
    """The v2 group under which sandboxes' groups can take memory and pids: this process's own, emptied of its
    processes (a group with processes cannot hand controllers to children)."""
    if own.name == "multiagent_rl-host":  # another process of this machine already emptied the group
        own = own.parent
    available = (own / "cgroup.controllers").read_text().split() if (own / "cgroup.controllers").exists() else []
    if not {"memory", "pids"} <= set(available):
        return None
    if _enable(own):
        return own
    host = _make(own, "multiagent_rl-host")
    if host is None:
        return None
    for pid in (own / "cgroup.procs").read_text().split():
        with contextlib.suppress(OSError):  # a process may have ended meanwhile
            (host / "cgroup.procs").write_text(pid)
    logger.info("sandbox: moved the processes of %s into %s so that sandboxes can have their own memory groups",
                own, host)
    return own if _enable(own) else None


def _enable(group: Path) -> bool:
    try:
        (group / "cgroup.subtree_control").write_text("+memory +pids")
    except OSError:
        return False
    return True


@dataclass
class CommandGroup:
    """The groups one command runs in. ``enter`` goes before the command line (see ``ENTER``)."""

    folders: list[Path] = field(default_factory=list)
    version: int | None = None

    @classmethod
    def create(cls, memory_bytes: int, max_processes: int) -> CommandGroup:
        """New groups with these limits (an empty group where control groups are unavailable)."""
        sup = support()
        if sup.version is None:
            return cls()
        name = f"cmd-{next(_counter)}"
        group = cls(version=sup.version)
        memory = sup.memory / name
        memory.mkdir()
        group.folders.append(memory)
        if sup.version == 1:
            _write(memory, "memory.limit_in_bytes", memory_bytes)
            _write(memory, "memory.memsw.limit_in_bytes", memory_bytes, optional=True)  # swap counts too
            if sup.pids is not None:
                pids = sup.pids / name
                pids.mkdir()
                group.folders.append(pids)
                _write(pids, "pids.max", max_processes)
        else:
            _write(memory, "memory.max", memory_bytes)
            _write(memory, "memory.swap.max", 0, optional=True)
            _write(memory, "memory.oom.group", 1, optional=True)  # an OOM kill takes the whole sandbox down
            _write(memory, "pids.max", max_processes)
        return group

    @property
    def bounds_processes(self) -> bool:
        return self.version == 2 or len(self.folders) == 2

    def enter(self) -> list[str]:
        """The command line prefix that moves the command into these groups and raises its OOM score."""
        return ["/bin/sh", "-c", ENTER, "sh", *(str(f / "cgroup.procs") for f in self.folders), "--"]

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of this group for exceeding its memory."""
        if not self.folders:
            return False
        text = _read(self.folders[0], "memory.oom_control" if self.version == 1 else "memory.events")
        return any(line.split()[:1] == ["oom_kill"] and int(line.split()[1]) > 0 for line in text.splitlines())

    def peak_bytes(self) -> int | None:
        if not self.folders:
            return None
        text = _read(self.folders[0], "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak")
        return int(text) if text.strip().isdigit() else None

    def kill(self, patience: float = 2.0) -> None:
        """SIGKILL every process left in the groups and wait until they are gone."""
        deadline = time.monotonic() + patience
        while time.monotonic() < deadline:
            pids = {int(p) for f in self.folders for p in _read(f, "cgroup.procs").split()}
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)
        logger.warning("sandbox: processes of %s outlived SIGKILL by %.0f s", self.folders, patience)

    def remove(self) -> None:
        """Kill what is left, then remove the groups (their memory charges go to the parent group)."""
        self.kill()
        for folder in self.folders:
            for _ in range(200):
                try:
                    folder.rmdir()
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EBUSY, errno.EAGAIN):
                        logger.warning("sandbox: cannot remove control group %s (%s)", folder, exc)
                        break
                    time.sleep(0.005)
        self.folders = []


def _write(folder: Path, name: str, value: int, optional: bool = False) -> None:
    try:
        (folder / name).write_text(str(value))
    except OSError:
        if not optional:
            raise


def _read(folder: Path, name: str) -> str:
    try:
        return (folder / name).read_text()
    except OSError:
        return ""
