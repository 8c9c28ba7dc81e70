"""Process plumbing for the sandbox: output capture with a cap, per-slot uids, killing and reaping."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from pathlib import Path

logger = logging.getLogger(__name__)

UID_BASE = 2_000_000_000
"""Root runs each concurrent sandbox as its own unprivileged uid, ``UID_BASE + SLOTS_PER_PROCESS × pid + slot``
(no account needed): the kernel counts the process limit per uid, so one sandbox's fork bomb cannot starve
another's processes, and the pid keeps two processes on one machine (the ranks of a multi-process run) from ever
sharing, or reaping, each other's uids. Linux pids stay below 2**22, so every uid stays below 2**32 - 1."""
SLOTS_PER_PROCESS = 512


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


def sandbox_uid(slot: int) -> int | None:
    if os.geteuid() != 0:
        return None
    return UID_BASE + SLOTS_PER_PROCESS * (os.getpid() % 2**22) + slot


def chown_tree(root: Path, uid: int) -> None:
    """Hand the workspace to this call's sandbox uid (a previous call may have run as another slot's uid)."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            try:
                os.lchown(name, uid, uid)
            except FileNotFoundError:
                pass


def threads_of(uid: int) -> int:
    """Threads the user runs now: an unprivileged process limit counts all of them, so a sandbox's budget is added."""
    n = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit() and owner(pid) == uid:
            with contextlib.suppress(OSError):  # the process may have ended meanwhile
                n += len(os.listdir(f"/proc/{pid}/task"))
    return n


async def reap_uid(uid: int, patience: float = 2.0) -> None:
    """Kill whatever still runs as a slot's uid and wait until it is gone, so that the next command in the slot
    gets the whole process budget (a pid namespace's processes die with it, but asynchronously)."""
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        if not kill_uid(uid):
            return
        await asyncio.sleep(0.01)
    logger.warning("processes of sandbox uid %d outlived their command by %.0f s (unreaped zombies?); the next "
                 "command in this slot starts with part of its process budget used", uid, patience)


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
    """A per-process pool of sandbox slots: bounds concurrency and gives each running command its own uid."""

    def __init__(self):
        self.free: list[int] | None = None
        self.cond: asyncio.Condition | None = None
        self.loop = None

    def __call__(self, size: int | None):
        return Slot(self, size or os.cpu_count() or 1)


class Slot:
    def __init__(self, pool: SlotPool, size: int):
        self.pool, self.size, self.slot = pool, size, None

    async def __aenter__(self) -> int:
        pool, loop = self.pool, asyncio.get_running_loop()
        if pool.loop is not loop:  # a fresh event loop (asyncio.run in a script) gets a fresh pool
            pool.loop, pool.cond, pool.free = loop, asyncio.Condition(), None
        async with pool.cond:
            if pool.free is None:
                pool.free = list(range(self.size))
            await pool.cond.wait_for(lambda: pool.free)
            self.slot = pool.free.pop(0)
        return self.slot

    async def __aexit__(self, *exc) -> None:
        pool = self.pool
        async with pool.cond:
            pool.free.append(self.slot)
            pool.cond.notify()


slots = SlotPool()
