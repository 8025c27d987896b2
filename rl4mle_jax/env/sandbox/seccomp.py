"""A small seccomp filter for the bwrap sandbox (bwrap's `--seccomp FD` loads it before exec).

Namespaces are bwrap's job; once inside, a program has no business making new ones (a user
namespace would hand it capabilities over a private mount namespace: kernel attack surface),
nor using io_uring, bpf, perf events, userfaultfd, the kernel keyring or mount calls. Those
fail with EPERM. clone3 fails with ENOSYS, which makes glibc fall back to clone, whose flags
(unlike clone3's) the filter can see. Calls from a foreign ABI (x32, int 0x80) are refused.
"""

from __future__ import annotations

import os
import platform
import struct

# BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h).
_LD_W_ABS, _JEQ_K, _JSET_K, _RET_K = 0x20, 0x15, 0x45, 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_EPERM, _ENOSYS = 1, 38
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET (clone's low byte is
# the exit signal, so CLONE_NEWTIME = 0x80 only exists for clone3 and unshare, both refused).
_CLONE_NS_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 \
    | 0x20000000 | 0x40000000

# arch -> (AUDIT_ARCH value, {syscall: number}); only the syscalls the filter names.
_ARCHES = {
    "x86_64": (0xC000003E, dict(
        unshare=272, setns=308, clone=56, clone3=435, mount=165, umount2=166, pivot_root=155,
        io_uring_setup=425, io_uring_enter=426, io_uring_register=427, bpf=321,
        perf_event_open=298, userfaultfd=323, add_key=248, request_key=249, keyctl=250,
        open_tree=428, move_mount=429, fsopen=430, fsconfig=431, fsmount=432, fspick=433,
        mount_setattr=442)),
    "aarch64": (0xC00000B7, dict(
        unshare=97, setns=268, clone=220, clone3=435, mount=40, umount2=39, pivot_root=41,
        io_uring_setup=425, io_uring_enter=426, io_uring_register=427, bpf=280,
        perf_event_open=241, userfaultfd=282, add_key=217, request_key=218, keyctl=219,
        open_tree=428, move_mount=429, fsopen=430, fsconfig=431, fsmount=432, fspick=433,
        mount_setattr=442)),
}
_X32_BIT = 0x40000000


def _ins(code: int, k: int, jt: int = 0, jf: int = 0) -> tuple[int, int, int, int]:
    return (code, jt, jf, k)


def build_filter(machine: str | None = None) -> bytes | None:
    """The filter as raw `struct sock_filter` records, or None for an architecture we lack."""
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        return None
    audit_arch, nr = _ARCHES[machine]
    denied = [v for k, v in nr.items() if k not in ("clone", "clone3")]
    # Layout (jump offsets count instructions skipped):
    #   0 ld arch; 1 jeq arch ? 2 : EPERM; 2 ld nr; [3 jset x32 ? EPERM : next]
    #   jeq denied_i ? EPERM : next ...; jeq clone3 ? ENOSYS : next; jeq clone ? next : ALLOW
    #   ld args[0] (low word); jset NS_FLAGS ? EPERM : ALLOW; ALLOW; EPERM; ENOSYS
    body: list[tuple[str, int]] = []  # (kind, k) before offsets are known
    body.append(("ld", 4))
    body.append(("arch", audit_arch))
    body.append(("ld", 0))
    if machine == "x86_64":
        body.append(("jset_deny", _X32_BIT))
    body += [("jeq_deny", n) for n in denied]
    body.append(("jeq_enosys", nr["clone3"]))
    body.append(("jeq_clone", nr["clone"]))
    body.append(("ld", 16))
    body.append(("jset_flags", _CLONE_NS_FLAGS))
    n = len(body)
    allow, eperm, enosys = n, n + 1, n + 2  # indices of the three return instructions
    prog = []
    for i, (kind, k) in enumerate(body):
        def off(target: int, i: int = i) -> int:
            return target - i - 1
        if kind == "ld":
            prog.append(_ins(_LD_W_ABS, k))
        elif kind == "arch":
            prog.append(_ins(_JEQ_K, k, jt=0, jf=off(eperm)))
        elif kind == "jset_deny":
            prog.append(_ins(_JSET_K, k, jt=off(eperm), jf=0))
        elif kind == "jeq_deny":
            prog.append(_ins(_JEQ_K, k, jt=off(eperm), jf=0))
        elif kind == "jeq_enosys":
            prog.append(_ins(_JEQ_K, k, jt=off(enosys), jf=0))
        elif kind == "jeq_clone":
            prog.append(_ins(_JEQ_K, k, jt=0, jf=off(allow)))
        elif kind == "jset_flags":
            prog.append(_ins(_JSET_K, k, jt=off(eperm), jf=off(allow)))
    prog += [_ins(_RET_K, _RET_ALLOW), _ins(_RET_K, _RET_ERRNO | _EPERM),
             _ins(_RET_K, _RET_ERRNO | _ENOSYS)]
    assert all(0 <= jt < 256 and 0 <= jf < 256 for _, jt, jf, _ in prog)
    return b"".join(struct.pack("<HBBI", *ins) for ins in prog)


def filter_fd(machine: str | None = None) -> int | None:
    """A pipe read end holding the filter (for `bwrap --seccomp FD`), or None."""
    data = build_filter(machine)
    if data is None:
        return None
    r, w = os.pipe()
    os.write(w, data)  # a few hundred bytes: fits the pipe buffer
    os.close(w)
    return r
