"""A workspace: one episode's folder, and the only place a sandboxed command may write.

What a command leaves in it is hostile input to the host: host-side reads and writes go through
[`files`][multiagent_rl.tools.sandbox.files] (no link followed, no blocking open, no recursion), listings are capped and
quote odd names, and removal cannot recurse. Run as root, a workspace made by
[`Workspace.create`][multiagent_rl.tools.sandbox.workspace.Workspace.create] is its own size-capped filesystem (a tmpfs
with ``disk_mb`` of space and ``max_files`` inodes), so a command cannot fill the host's disk, and cleanup is one
unmount; elsewhere the same quota is measured after every command instead (see ``Sandbox``).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import stat
import tempfile
import weakref
from pathlib import Path

from .files import NotARegularFile, UnsafePath, open_dir, open_file, parts, read_bytes, remove_contents, walk
from .processes import allocate_uid, release_uid

logger = logging.getLogger(__name__)

SANDBOX_HOME = "/workspace"
"""Where the workspace appears inside the sandbox (its working directory and ``HOME``)."""
DEFAULT_DISK_MB = 32
DEFAULT_MAX_FILES = 2048
LIST_MAX_ENTRIES = 2000
"""Entries a listing shows before it stops (with a note saying so)."""
LIST_MAX_DEPTH = 32

_live: weakref.WeakSet[Workspace] = weakref.WeakSet()


class WorkspaceEscape(UnsafePath):
    """Raised for a path that leaves the workspace (``..``, an absolute path, a symbolic link)."""


class Workspace:
    """One episode's folder; host-side file access refuses any path that could leave it."""

    def __init__(self, root: str | Path, *, owned: bool = False):
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise FileNotFoundError(f"workspace {self.root} is not a folder")
        self._owned = owned
        self.quota_mounted = False
        """True when the workspace is its own size-capped filesystem (root only)."""
        self.disk_mb, self.max_files = DEFAULT_DISK_MB, DEFAULT_MAX_FILES
        self.uid: int | None = None
        """The unprivileged uid its commands run as (root only; None: they run as this process's user)."""
        self._chowned = False

    @classmethod
    def create(cls, parent: str | Path | None = None, prefix: str = "ws-", *, disk_mb: int = DEFAULT_DISK_MB,
               max_files: int = DEFAULT_MAX_FILES) -> Workspace:
        """A fresh empty workspace under ``parent`` (default: the system's temp folder), removed by
        [`cleanup`][multiagent_rl.tools.sandbox.workspace.Workspace.cleanup]. Run as root it is a tmpfs of ``disk_mb``
        MB and ``max_files`` inodes (counted in the machine's memory: a tmpfs lives in RAM)."""
        root = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        root.chmod(0o755)  # the unprivileged sandbox user must reach it
        ws = cls(root, owned=True)
        ws.disk_mb, ws.max_files = disk_mb, max_files
        if os.geteuid() == 0:
            ws.quota_mounted = _mount_tmpfs(root, disk_mb, max_files)
        _live.add(ws)
        return ws

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc) -> None:
        self.cleanup()

    def cleanup(self) -> None:
        """Remove the folder if this object created it (whatever a command left in it), and free its uid."""
        if self._owned and self.root.exists():
            if self.quota_mounted:
                _unmount(self.root)
                self.quota_mounted = False
            else:
                self._remove_contents()
            with contextlib.suppress(OSError):
                self.root.rmdir()
        _live.discard(self)
        release_uid(self.uid)
        self.uid = None

    def _remove_contents(self) -> None:
        fd = self._root_fd()
        try:
            remove_contents(fd)
        except OSError as exc:
            logger.warning("workspace %s: could not remove everything in it (%s)", self.root, exc)
        finally:
            os.close(fd)

    # -- the sandbox's side ---------------------------------------------------------------------
    def prepare(self) -> int | None:
        """Before a command: the uid it runs as, owning the workspace's top folder with mode 755 again (a command
        may have changed either)."""
        if self.uid is None:
            self.uid = allocate_uid()
        fd = self._root_fd()
        try:
            if self.uid is not None:
                if not self._chowned:  # a folder made elsewhere: hand what is in it over once
                    for components, _ in walk(fd, 100_000, 256):
                        self._chown(fd, components)
                    self._chowned = True
                os.fchown(fd, self.uid, self.uid)
            os.fchmod(fd, 0o755)
        finally:
            os.close(fd)
        return self.uid

    def usage(self, limit: int | None = None) -> tuple[int, int]:
        """``(bytes, entries)`` in the workspace, counting at most ``limit`` entries (default: ``max_files`` + 1)."""
        fd = self._root_fd()
        try:
            size = entries = 0
            for _, info in walk(fd, limit or self.max_files + 1, 10_000):
                entries += 1
                size += info.st_blocks * 512
            return size, entries
        finally:
            os.close(fd)

    # -- host-side access -----------------------------------------------------------------------
    def resolve(self, path: str | Path) -> Path:
        """The host path of ``path`` (relative to the workspace, or under ``/workspace``); raises
        [`WorkspaceEscape`][multiagent_rl.tools.sandbox.workspace.WorkspaceEscape] for ``..``, an absolute path or a
        symbolic link on the way (links are never followed outside the sandbox)."""
        components = self._parts(path)
        if components:
            root = self._root_fd()
            try:
                parent = open_dir(root, components[:-1])
            except UnsafePath as exc:
                raise WorkspaceEscape(str(exc)) from None
            except OSError:  # a missing folder on the way: nothing to follow
                parent = None
            finally:
                os.close(root)
            if parent is not None:
                try:
                    info = os.stat(components[-1], dir_fd=parent, follow_symlinks=False)
                except OSError:
                    info = None
                finally:
                    os.close(parent)
                if info is not None and stat.S_ISLNK(info.st_mode):
                    raise WorkspaceEscape(f"{str(path)!r} is a symbolic link that could lead outside the workspace; "
                                          "links are not followed outside the sandbox")
        return self.root.joinpath(*components)

    def write(self, path: str, text: str) -> Path:
        """Write a text file (folders made on the way), owned by the workspace's uid."""
        fd = self._open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            data = text.encode("utf-8")
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if self.uid is not None:
                os.fchown(fd, self.uid, self.uid)
        finally:
            os.close(fd)
        return self.root.joinpath(*self._parts(path))

    def read(self, path: str, max_bytes: int = 1_000_000) -> str:
        """A text file's first ``max_bytes`` bytes (a note says where it was cut). Never blocks: a FIFO, socket or
        device raises [`NotARegularFile`][multiagent_rl.tools.sandbox.files.NotARegularFile]."""
        fd = self._open(path, os.O_RDONLY)
        try:
            data = read_bytes(fd, max_bytes + 1)
        finally:
            os.close(fd)
        text = data[:max_bytes].decode("utf-8", errors="replace")
        return text + (f"\n[... cut at {max_bytes} bytes]" if len(data) > max_bytes else "")

    def files(self, max_entries: int = LIST_MAX_ENTRIES, max_depth: int = LIST_MAX_DEPTH) -> list[str]:
        """Every file that is not a folder, as sorted paths relative to the workspace (symbolic links are listed,
        never followed; a name with a control character or a quote is shown as a Python string literal). Stops
        after ``max_entries`` entries and ``max_depth`` levels."""
        return self._listing(max_entries, max_depth)[0]

    def listing(self, max_entries: int = LIST_MAX_ENTRIES, max_depth: int = LIST_MAX_DEPTH) -> str:
        """[`files`][multiagent_rl.tools.sandbox.workspace.Workspace.files] as text, one per line, with a last line
        saying where the listing stopped, if it did."""
        names, complete = self._listing(max_entries, max_depth)
        return "\n".join(names + ([] if complete else [f"[... listing stopped after {max_entries} entries or "
                                                       f"{max_depth} levels]"]))

    def _listing(self, max_entries: int, max_depth: int) -> tuple[list[str], bool]:
        fd = self._root_fd()
        try:
            names, entries, deepest = [], 0, 0
            for components, info in walk(fd, max_entries, max_depth):
                entries += 1
                deepest = max(deepest, len(components))
                if not stat.S_ISDIR(info.st_mode):
                    names.append("/".join(display_name(c) for c in components))
        finally:
            os.close(fd)
        return sorted(names), entries < max_entries and deepest < max_depth

    # -- helpers --------------------------------------------------------------------------------
    def _parts(self, path: str | Path) -> list[str]:
        p = str(path)
        if p == SANDBOX_HOME or p.startswith(SANDBOX_HOME + "/"):
            p = p[len(SANDBOX_HOME):].lstrip("/")
        try:
            return parts(p)
        except UnsafePath as exc:
            raise WorkspaceEscape(str(exc)) from None

    def _root_fd(self) -> int:
        return os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)

    def _open(self, path: str, flags: int) -> int:
        root = self._root_fd()
        try:
            return open_file(root, "/".join(self._parts(path)), flags)
        except UnsafePath as exc:
            raise WorkspaceEscape(str(exc)) from None
        finally:
            os.close(root)

    def _chown(self, root_fd: int, components: list[str]) -> None:
        parent = open_dir(root_fd, components[:-1])
        try:
            os.chown(components[-1], self.uid, self.uid, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            pass
        finally:
            os.close(parent)


def display_name(name: str) -> str:
    """A file name as a listing shows it: as is when printable, else as a Python string literal (so a newline in a
    name cannot forge a line of the listing)."""
    if name.isprintable() and "'" not in name and '"' not in name and "\\" not in name:
        return name
    return repr(name)


# -- the tmpfs quota (root only) ---------------------------------------------------------------------
_libc = ctypes.CDLL(None, use_errno=True)
_MNT_DETACH = 2
_warned_mount = False


def _mount_tmpfs(root: Path, disk_mb: int, max_files: int) -> bool:
    options = f"size={disk_mb}m,nr_inodes={max_files},mode=0755".encode()
    if _libc.mount(b"tmpfs", str(root).encode(), b"tmpfs", 0, options) == 0:
        return True
    global _warned_mount
    if not _warned_mount:
        _warned_mount = True
        logger.warning("workspace %s: cannot mount a size-capped tmpfs (%s): the disk quota is checked after each "
                       "command instead of enforced by the kernel", root, os.strerror(ctypes.get_errno()))
    return False


def _unmount(root: Path) -> None:
    if _libc.umount2(str(root).encode(), _MNT_DETACH) != 0:
        logger.warning("workspace %s: unmount failed (%s)", root, os.strerror(ctypes.get_errno()))


@atexit.register
def _cleanup_all() -> None:
    """A workspace not cleaned up by its owner is removed at exit (a mounted one would outlive the process)."""
    for ws in list(_live):
        ws.cleanup()


__all__ = ["DEFAULT_DISK_MB", "DEFAULT_MAX_FILES", "NotARegularFile", "SANDBOX_HOME", "Workspace", "WorkspaceEscape",
           "display_name"]
