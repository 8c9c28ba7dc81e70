"""What a sandbox may use (``SandboxConfig``) and what a command did (``CommandResult``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .workspace import DEFAULT_DISK_MB, DEFAULT_MAX_FILES, Workspace


class SandboxConfig(BaseModel):
    """Limits and isolation of the commands tools run (the table in docs/agentic_judge.md is generated from these
    fields: [`limits_table`][multiagent_rl.tools.sandbox.limits_table])."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    isolation: Literal["bwrap", "none"] = "bwrap"
    """``bwrap``: bubblewrap namespaces (refused with install instructions where it is missing or cannot start).
    ``none``: plain subprocesses with the same limits but no isolation, marked as not isolated everywhere."""
    timeout: float = Field(20.0, gt=0)
    """Wall-clock seconds one command may run before the whole sandbox is killed."""
    cpu_seconds: int = Field(10, ge=1)
    """CPU seconds each process may use (RLIMIT_CPU)."""
    memory_mb: int = Field(1024, ge=64)
    """Memory of the whole sandbox, shared memory, tmpfs, memfd and kernel memory included (a memory control group;
    root only), and the address space of each process (RLIMIT_AS, everywhere)."""
    max_processes: int = Field(32, ge=1)
    """Processes (threads) the sandbox may run at once (a pids control group and RLIMIT_NPROC)."""
    max_file_mb: int = Field(16, ge=1)
    """Largest file a command may write (RLIMIT_FSIZE)."""
    max_open_files: int = Field(64, ge=8)
    """Open file descriptors of each process (RLIMIT_NOFILE)."""
    disk_mb: int = Field(DEFAULT_DISK_MB, ge=1)
    """Space of a workspace made by ``Workspace.create`` (its own tmpfs as root; measured after each command
    elsewhere)."""
    max_files: int = Field(DEFAULT_MAX_FILES, ge=16)
    """Files and folders (inodes) a workspace may hold, enforced like ``disk_mb``."""
    max_output_bytes: int = Field(64_000, ge=1024)
    """Output captured from stdout and stderr together; a command that writes more is killed."""
    max_concurrent: int | None = Field(None, ge=1, le=512)
    """Commands running at once in this process (default: the number of CPUs)."""
    ro_binds: list[str] = Field(default_factory=list)
    """Extra host paths mounted read-only at the same place (e.g. an interpreter outside ``/usr``)."""

    def workspace(self, prefix: str = "ws-", parent: str | Path | None = None) -> Workspace:
        """A fresh workspace with this config's quota (``disk_mb``, ``max_files``)."""
        return Workspace.create(parent, prefix, disk_mb=self.disk_mb, max_files=self.max_files)


@dataclass
class CommandResult:
    """What one command did. ``killed`` names the limit that stopped it (None: it ended by itself)."""

    command: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    duration: float
    killed: str | None = None
    """``"timeout"`` (wall clock), ``"output"`` (output cap), ``"memory"`` (the sandbox's memory group ran out),
    ``"disk quota"`` (the workspace was left over its quota, where the kernel does not enforce it) or
    ``"signal <name>"`` (a resource limit: e.g. SIGXCPU for CPU seconds, SIGXFSZ for file size)."""
    isolated: bool = True
    peak_memory_mb: float | None = None
    """The sandbox's peak memory (None where it has no memory group)."""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.killed is None

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self, max_chars: int = 4000) -> str:
        """The result as an agent reads it: exit status, what stopped it, then the output (cut to ``max_chars``)."""
        head = f"exit code: {self.returncode}" if self.killed is None else f"killed: {self.killed}"
        if not self.isolated:
            head += " (not isolated)"
        body = self.stdout + (f"\n[stderr]\n{self.stderr}" if self.stderr.strip() else "")
        if len(body) > max_chars:
            body = body[:max_chars] + f"\n[... {len(body) - max_chars} more characters cut]"
        return f"{head}\n{body}".rstrip()


def limits_table() -> str:
    """The Markdown table of [`SandboxConfig`][multiagent_rl.tools.sandbox.SandboxConfig]'s settings, their defaults and
    what each bounds, as docs/agentic_judge.md shows it (a test keeps the two equal)."""
    rows = ["| setting | default | what it bounds |", "|---|---|---|"]
    for name, field in SandboxConfig.model_fields.items():
        default = field.get_default(call_default_factory=True)
        shown = "none" if default is None or default == [] else f"`{default}`"
        about = " ".join((field.description or "").split()).replace("|", "\\|")
        rows.append(f"| `{name}` | {shown} | {about} |")
    return "\n".join(rows)
