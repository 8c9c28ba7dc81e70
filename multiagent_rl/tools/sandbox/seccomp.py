"""A seccomp filter for sandboxed commands: the system calls a sandbox never needs and the host must not share.

bubblewrap loads a classic BPF program from a file descriptor (``bwrap --seccomp FD``) just before it starts the
command; the kernel then answers the calls below with ``EPERM`` for the command and everything it starts:

- ``keyctl``, ``add_key``, ``request_key``: the kernel keyrings are not namespaced, and a sandboxed process inherits
  the trainer's session keyring (it could read and overwrite the keys in it);
- ``ptrace``, ``process_vm_readv``, ``process_vm_writev``: a process may not read or change another's memory (the
  grader that runs beside a solution inside one sandbox relies on it, with ``PR_SET_DUMPABLE`` off);
- ``bpf``, ``perf_event_open``, ``userfaultfd``, ``io_uring_*``: large kernel attack surfaces no test needs
  (container runtimes refuse most of them by default too).

System calls of any other architecture than the host's (32-bit calls through ``int 0x80`` on x86-64, the x32 ABI)
are refused as a whole, so the numbers above cannot be reached under another numbering.
"""

from __future__ import annotations

import errno
import os
import platform
import struct

BLOCKED = ("keyctl", "add_key", "request_key", "ptrace", "process_vm_readv", "process_vm_writev", "bpf",
           "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register")
"""The refused system calls, by name (numbers per architecture in ``_NUMBERS``)."""

# <linux/audit.h> architecture tags and the syscall numbers of <asm/unistd.h> for each supported machine.
_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_NUMBERS = {
    "x86_64": {"ptrace": 101, "add_key": 248, "request_key": 249, "keyctl": 250, "perf_event_open": 298,
               "process_vm_readv": 310, "process_vm_writev": 311, "bpf": 321, "userfaultfd": 323,
               "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427},
    "aarch64": {"ptrace": 117, "add_key": 217, "request_key": 218, "keyctl": 219, "perf_event_open": 241,
                "process_vm_readv": 270, "process_vm_writev": 271, "bpf": 280, "userfaultfd": 282,
                "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427},
}
_X32_BIT = 0x40000000  # x86-64's x32 ABI numbers the same calls with this bit set

# struct sock_filter {u16 code; u8 jt; u8 jf; u32 k} and the opcodes the program uses
_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_OFFSET_NR, _OFFSET_ARCH = 0, 4  # in struct seccomp_data


def supported() -> bool:
    """Whether a filter exists for this machine's architecture."""
    return platform.machine() in _ARCH


def program(machine: str | None = None) -> bytes:
    """The compiled filter for ``machine`` (default: this one) as bubblewrap reads it."""
    machine = machine or platform.machine()
    if machine not in _ARCH:
        raise ValueError(f"no seccomp filter for architecture {machine!r}; known: {sorted(_ARCH)}")
    numbers = sorted(_NUMBERS[machine][name] for name in BLOCKED)
    deny = _RET_ERRNO | errno.EPERM
    # Layout: [0] load arch, [1] foreign arch -> deny, [2] load nr, [3] x32 -> deny, [4..] one jeq per call,
    # then allow, then deny. Jump offsets count instructions after the jumping one.
    n = len(numbers)
    allow_at = 4 + n
    deny_at = allow_at + 1
    code = [(_LD_W_ABS, 0, 0, _OFFSET_ARCH),
            (_JEQ_K, 0, deny_at - 2, _ARCH[machine]),
            (_LD_W_ABS, 0, 0, _OFFSET_NR),
            (_JGE_K, deny_at - 4, 0, _X32_BIT) if machine == "x86_64" else (_JEQ_K, 0, 0, 0)]
    for i, nr in enumerate(numbers):
        at = 4 + i
        code.append((_JEQ_K, deny_at - at - 1, 0, nr))
    code += [(_RET_K, 0, 0, _RET_ALLOW), (_RET_K, 0, 0, deny)]
    return b"".join(struct.pack("=HBBI", *ins) for ins in code)


def filter_fd() -> int:
    """A readable file descriptor holding the program, positioned at its start (the caller passes it to bubblewrap
    and closes it once the command has started)."""
    fd = os.memfd_create("multiagent_rl-seccomp", os.MFD_CLOEXEC)
    os.write(fd, program())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
