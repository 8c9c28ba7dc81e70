"""Host-side file access inside a folder that hostile code has written: never follow a link, never block, never
recurse, never build a path longer than one name.

Everything here goes one path component at a time from an open directory (``openat`` with ``O_NOFOLLOW``), so a
planted symbolic link is seen instead of followed, a tree deeper than ``PATH_MAX`` (or than Python's recursion
limit) is walked and removed like any other, and a FIFO, socket or device is opened without blocking
(``O_NONBLOCK``) and refused after ``fstat`` unless it is a regular file.
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
from collections.abc import Iterator

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_KINDS = {stat.S_IFIFO: "FIFO", stat.S_IFSOCK: "socket", stat.S_IFCHR: "character device",
          stat.S_IFBLK: "block device", stat.S_IFDIR: "directory", stat.S_IFLNK: "symbolic link"}


class UnsafePath(ValueError):
    """A path that leaves the folder: absolute, with ``..``, or through a symbolic link."""


class NotARegularFile(OSError):
    """The path names a FIFO, socket, device or directory where a regular file was expected."""


def parts(path: str) -> list[str]:
    """The components of a relative path; raises [`UnsafePath`][multiagent_rl.tools.sandbox.files.UnsafePath] for an
    absolute path or ``..`` (``.`` and empty components are dropped)."""
    if "\0" in path:
        raise UnsafePath(f"{path!r} contains a NUL byte")
    if os.path.isabs(path):
        raise UnsafePath(f"{path!r} is an absolute path outside the workspace; use a path relative to it")
    out = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in out:
        raise UnsafePath(f"{path!r} leads outside the workspace ('..')")
    return out


def open_dir(root_fd: int, components: list[str], create: bool = False) -> int:
    """An fd of the directory ``components`` below ``root_fd`` (made on the way when ``create``)."""
    fd = os.dup(root_fd)
    try:
        for i, name in enumerate(components):
            try:
                nxt = os.open(name, _DIR, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(name, 0o755, dir_fd=fd)
                nxt = os.open(name, _DIR, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    _refuse_link(fd, name, "/".join(components[: i + 1]))
                raise
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_file(root_fd: int, path: str, flags: int, mode: int = 0o644) -> int:
    """An fd of the regular file at ``path``: opened without following a link and without blocking, then checked to
    be a regular file (raises [`NotARegularFile`][multiagent_rl.tools.sandbox.files.NotARegularFile] otherwise)."""
    *folders, name = parts(path) or ["."]
    parent = open_dir(root_fd, folders, create=bool(flags & os.O_CREAT))
    try:
        try:
            fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, mode, dir_fd=parent)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                _refuse_link(parent, name, path)
            if exc.errno == errno.ENXIO:  # a socket, or a FIFO opened for writing with no reader
                raise NotARegularFile(errno.ENXIO, f"{path} is a {kind(parent, name)}, not a regular file") from None
            raise
    finally:
        os.close(parent)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise NotARegularFile(errno.EINVAL, f"{path} is a {_KINDS.get(stat.S_IFMT(info.st_mode), 'special file')}, "
                                            "not a regular file")
    return fd


def read_bytes(fd: int, limit: int) -> bytes:
    """Up to ``limit`` bytes from ``fd``."""
    chunks, size = [], 0
    while size < limit:
        chunk = os.read(fd, min(1 << 20, limit - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def kind(dir_fd: int, name: str) -> str:
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError:
        return "missing file"
    return _KINDS.get(stat.S_IFMT(mode), "regular file" if stat.S_ISREG(mode) else "special file")


def _refuse_link(dir_fd: int, name: str, shown: str) -> None:
    try:
        target = os.readlink(name, dir_fd=dir_fd)
    except OSError:
        return
    raise UnsafePath(f"{shown!r} goes through a symbolic link (-> {target!r}) that could lead outside the "
                     "workspace; links are not followed outside the sandbox")


def walk(root_fd: int, max_entries: int, max_depth: int) -> Iterator[tuple[list[str], os.stat_result]]:
    """``(components, lstat)`` of every entry below ``root_fd``, depth first in name order, without following links;
    stops after ``max_entries`` entries and does not descend below ``max_depth`` levels."""
    stack: list[list[str]] = [[]]
    seen = 0
    while stack:
        folder = stack.pop()
        try:
            fd = open_dir(root_fd, folder)
        except (OSError, UnsafePath):  # replaced meanwhile; a walk is a snapshot of what it could read
            continue
        try:
            with os.scandir(fd) as it:
                names = sorted(itertools.islice((e.name for e in it), max_entries - seen + 1))
            subfolders = []
            for name in names:
                if seen >= max_entries:
                    return
                try:
                    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    continue
                seen += 1
                yield folder + [name], info
                if stat.S_ISDIR(info.st_mode) and len(folder) + 1 < max_depth:
                    subfolders.append(folder + [name])
        finally:
            os.close(fd)
        stack.extend(reversed(subfolders))


def remove_contents(root_fd: int) -> None:
    """Remove everything below ``root_fd`` with O(1) open descriptors and no recursion, however deep or long the
    paths: each pass deletes the top level's files and lifts the top level's sub-folders' entries up to the top."""
    fresh = itertools.count()
    while True:
        os.fchmod(root_fd, 0o700)
        with os.scandir(root_fd) as it:
            entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        if not entries:
            return
        for name, is_dir in entries:
            if not is_dir:
                _unlink(root_fd, name)
                continue
            try:
                sub = os.open(name, _DIR, dir_fd=root_fd)
            except PermissionError:  # a folder of mode 000 (not root): ours to open up again
                os.chmod(name, 0o700, dir_fd=root_fd, follow_symlinks=False)
                sub = os.open(name, _DIR, dir_fd=root_fd)
            try:
                os.fchmod(sub, 0o700)
                with os.scandir(sub) as it:
                    children = [e.name for e in it]
                for child in children:
                    os.rename(child, f".mrl-{os.getpid()}-{next(fresh)}", src_dir_fd=sub, dst_dir_fd=root_fd)
            finally:
                os.close(sub)
            os.rmdir(name, dir_fd=root_fd)


def _unlink(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
