"""Process plumbing for the sandbox: output capture with a cap, sandbox uids, killing and reaping."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import secrets
import signal
import tempfile
import time
from pathlib import Path

logger = logging.getLogger(__name__)

UID_BASE = 0x70000000
"""Run as root, each workspace's commands run as an unprivileged uid of their own (no account needed), taken from a
block of ``UID_BLOCK`` uids in ``[UID_BASE, 2**31 - 1)`` that this process draws at random and holds (262,143
blocks, above the ranges systemd gives containers; bubblewrap refuses uids from 2**31 up). Uids, and the kernel's
per-uid process counts, are shared by every container of a machine that does not remap users, and trainers in
containers are often pid 1 of their own pid namespace, so the block cannot come from the pid: two trainers on one
machine draw the same block with odds of 1 in 262,143, and a block is taken only when no process this one can see
runs under it and no other process sharing this machine's temp folder holds its lock file."""
UID_BLOCK = 1024
_BLOCKS = (2**31 - 1 - UID_BASE) // UID_BLOCK
LOCK_DIR = Path(tempfile.gettempdir()) / "multiagent_rl-uids"


class OutputCollector(asyncio.SubprocessProtocol):
    """Collects stdout and stderr up to a shared cap; past the cap it keeps draining (so the pipes close) but
    discards, and signals the caller to kill the command."""

    def __init__(self, cap: int):
        self.cap, self.size = cap, 0
        self.chunks: dict[int, list[bytes]] = {1: [], 2: []}
        self.exited, self.over_cap, self.closed = asyncio.Event(), asyncio.Event(), asyncio.Event()
        self.open_pipes = {1, 2}

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        keep = data[: max(0, self.cap - self.size)]
        if keep:
            self.chunks[fd].append(keep)
        self.size += len(data)
        if self.size > self.cap:
            self.over_cap.set()

    def pipe_connection_lost(self, fd: int, exc) -> None:
        self.open_pipes.discard(fd)
        if not self.open_pipes:
            self.closed.set()

    def process_exited(self) -> None:
        self.exited.set()

    def text(self, fd: int) -> str:
        return b"".join(self.chunks[fd]).decode("utf-8", errors="replace")


class _UidBlock:
    """This process's block of sandbox uids (see ``UID_BASE``); a forked child draws its own."""

    def __init__(self):
        self.pid = os.getpid()
        LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
        for _ in range(64):
            index = secrets.randbelow(_BLOCKS)
            start = UID_BASE + index * UID_BLOCK
            lock = self._lock(index)
            if lock is not None and not _in_use(start, start + UID_BLOCK):
                self.lock, self.start = lock, start
                self.free = list(range(start, start + UID_BLOCK))
                return
            if lock is not None:
                os.close(lock)
        raise RuntimeError("no free block of sandbox uids found in 64 random draws")

    @staticmethod
    def _lock(index: int) -> int | None:
        fd = os.open(LOCK_DIR / f"{index}.lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd


_block: _UidBlock | None = None


def allocate_uid() -> int | None:
    """A uid no other workspace of this machine uses (None unless root: commands then run as this user)."""
    global _block
    if os.geteuid() != 0:
        return None
    if _block is None or _block.pid != os.getpid():
        _block = _UidBlock()
    if not _block.free:
        raise RuntimeError(f"all {UID_BLOCK} sandbox uids of this process are in use: clean up workspaces "
                           "(Workspace.cleanup, or use them as context managers)")
    uid = _block.free.pop(0)
    kill_uid(uid)  # nothing should run under it; if something does, it is not ours to keep
    return uid


def release_uid(uid: int | None) -> None:
    """Kill whatever still runs as ``uid`` and give the uid back to this process's block."""
    if uid is None:
        return
    kill_uid(uid)
    if _block is not None and _block.pid == os.getpid() and _block.start <= uid < _block.start + UID_BLOCK:
        _block.free.append(uid)


def _in_use(start: int, stop: int) -> bool:
    return any(start <= (owner(pid) or 0) < stop for pid in os.listdir("/proc") if pid.isdigit())


def threads_of(uid: int) -> int:
    """Threads the user runs now: an unprivileged process limit counts all of them, so a sandbox's budget is added."""
    n = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit() and owner(pid) == uid:
            with contextlib.suppress(OSError):  # the process may have ended meanwhile
                n += len(os.listdir(f"/proc/{pid}/task"))
    return n


async def reap_uid(uid: int, patience: float = 2.0) -> None:
    """Kill whatever still runs as ``uid`` and wait until it is gone (a pid namespace's processes die with it, but
    asynchronously)."""
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        if not kill_uid(uid):
            return
        await asyncio.sleep(0.01)
    logger.warning("processes of sandbox uid %d outlived their command by %.0f s (unreaped zombies?); the next "
                   "command of this workspace starts with part of its process budget used", uid, patience)


def kill_uid(uid: int, spare: int | None = None) -> int:
    """SIGKILL every process of ``uid`` but ``spare``; returns how many there were (zombies included)."""
    left = [int(pid) for pid in os.listdir("/proc") if pid.isdigit() and owner(pid) == uid and int(pid) != spare]
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return len(left)


def owner(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class SlotPool:
    """Bounds how many commands run at once in this process (per event loop)."""

    def __init__(self):
        self.semaphore: asyncio.Semaphore | None = None
        self.loop = None

    def __call__(self, size: int | None) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self.loop is not loop:  # a fresh event loop (asyncio.run in a script) gets a fresh pool
            self.loop, self.semaphore = loop, asyncio.Semaphore(size or os.cpu_count() or 1)
        return self.semaphore


slots = SlotPool()
