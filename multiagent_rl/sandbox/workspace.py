"""A workspace: one episode's folder, and the only place a sandboxed command may write."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

SANDBOX_HOME = "/workspace"
"""Where the workspace appears inside the sandbox (its working directory and ``HOME``)."""


class WorkspaceEscape(ValueError):
    """Raised for a path that leaves the workspace (``..``, an absolute path, a symlink pointing out)."""


class Workspace:
    """One episode's folder. Host-side file access goes through
    [`resolve`][multiagent_rl.sandbox.workspace.Workspace.resolve], which refuses any path that leaves the folder,
    including through symlinks a command planted."""

    def __init__(self, root: str | Path, *, owned: bool = False):
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise FileNotFoundError(f"workspace {self.root} is not a folder")
        self._owned = owned

    @classmethod
    def create(cls, parent: str | Path | None = None, prefix: str = "ws-") -> Workspace:
        """A fresh empty workspace under ``parent`` (default: the system's temp folder), removed by
        [`cleanup`][multiagent_rl.sandbox.workspace.Workspace.cleanup]."""
        root = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        root.chmod(0o755)  # the unprivileged sandbox user must reach it
        return cls(root, owned=True)

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc) -> None:
        self.cleanup()

    def cleanup(self) -> None:
        """Remove the folder if this object created it."""
        if self._owned:
            shutil.rmtree(self.root, ignore_errors=True)

    def resolve(self, path: str | Path) -> Path:
        """The host path of ``path`` (relative to the workspace, or under ``/workspace``); raises
        [`WorkspaceEscape`][multiagent_rl.sandbox.workspace.WorkspaceEscape] if it resolves outside the workspace."""
        p = str(path)
        if p == SANDBOX_HOME or p.startswith(SANDBOX_HOME + "/"):
            p = p[len(SANDBOX_HOME):].lstrip("/") or "."
        if os.path.isabs(p):
            raise WorkspaceEscape(f"{path!r} is an absolute path outside the workspace; use a path relative to it")
        target = (self.root / p).resolve()
        if target != self.root and self.root not in target.parents:
            raise WorkspaceEscape(f"{path!r} leads outside the workspace")
        return target

    def write(self, path: str, text: str) -> Path:
        target = self.resolve(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        return target

    def read(self, path: str, max_bytes: int = 1_000_000) -> str:
        target = self.resolve(path)
        with open(target, "rb") as f:
            data = f.read(max_bytes + 1)
        text = data[:max_bytes].decode("utf-8", errors="replace")
        return text + (f"\n[... cut at {max_bytes} bytes]" if len(data) > max_bytes else "")

    def files(self) -> list[str]:
        """Every regular file, as sorted paths relative to the workspace (symlinks are listed, not followed)."""
        out = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(dirpath, d)))
            rel = os.path.relpath(dirpath, self.root)
            out.extend(os.path.normpath(os.path.join(rel, f)) for f in filenames)
        return sorted(out)
