"""A small seccomp filter for the bwrap sandbox (bwrap's `--seccomp FD` loads it before exec).

Namespaces are bwrap's job; once inside, a program has no business making new ones (a user
namespace would hand it capabilities over a private mount namespace: kernel attack surface),
nor using io_uring, bpf, perf events, userfaultfd, the kernel keyring or mount calls. Those
fail with EPERM. socket() and socketpair() work only for AF_UNIX, AF_INET and AF_INET6; every
other family (AF_VSOCK, which the network namespace does not cover, AF_NETLINK, AF_PACKET, ...)
fails with EAFNOSUPPORT. clone3 fails with ENOSYS, which makes glibc fall back to clone, whose flags
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
_EPERM, _ENOSYS, _EAFNOSUPPORT = 1, 38, 97
# socket()/socketpair() families a program needs in an empty network namespace: AF_UNIX
# (multiprocessing), AF_INET, AF_INET6 (loopback only there). vsock, netlink, packet, ... fail.
_ALLOWED_FAMILIES = (1, 2, 10)
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
        mount_setattr=442, socket=41, socketpair=53)),
    "aarch64": (0xC00000B7, dict(
        unshare=97, setns=268, clone=220, clone3=435, mount=40, umount2=39, pivot_root=41,
        io_uring_setup=425, io_uring_enter=426, io_uring_register=427, bpf=280,
        perf_event_open=241, userfaultfd=282, add_key=217, request_key=218, keyctl=219,
        open_tree=428, move_mount=429, fsopen=430, fsconfig=431, fsmount=432, fspick=433,
        mount_setattr=442, socket=198, socketpair=199)),
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
    special = ("clone", "clone3", "socket", "socketpair")
    denied = [v for k, v in nr.items() if k not in special]
    # (op, k, jump-if-true label, jump-if-false label); labels name instruction indices, None
    # falls through. args[0]'s low word sits at offset 16 (struct seccomp_data).
    prog: list[tuple] = [("ld", 4), ("jeq", audit_arch, None, "eperm"), ("ld", 0)]
    if machine == "x86_64":
        prog.append(("jset", _X32_BIT, "eperm", None))
    prog += [("jeq", n, "eperm", None) for n in denied]
    prog += [("jeq", nr["clone3"], "enosys", None), ("jeq", nr["socket"], "sock", None),
             ("jeq", nr["socketpair"], "sock", None), ("jeq", nr["clone"], None, "allow"),
             ("ld", 16), ("jset", _CLONE_NS_FLAGS, "eperm", "allow"),
             ("label", "sock"), ("ld", 16)]
    prog += [("jeq", af, "allow", None) for af in _ALLOWED_FAMILIES]
    prog += [("ret", _RET_ERRNO | _EAFNOSUPPORT), ("label", "allow"), ("ret", _RET_ALLOW),
             ("label", "eperm"), ("ret", _RET_ERRNO | _EPERM),
             ("label", "enosys"), ("ret", _RET_ERRNO | _ENOSYS)]
    at, i = {}, 0
    for ins in prog:
        if ins[0] == "label":
            at[ins[1]] = i
        else:
            i += 1
    out, i = [], 0
    for ins in prog:
        if ins[0] == "label":
            continue
        op, k = ins[0], ins[1]
        if op == "ld":
            out.append(_ins(_LD_W_ABS, k))
        elif op == "ret":
            out.append(_ins(_RET_K, k))
        else:
            jt, jf = (0 if t is None else at[t] - i - 1 for t in ins[2:4])
            out.append(_ins(_JEQ_K if op == "jeq" else _JSET_K, k, jt=jt, jf=jf))
        i += 1
    assert all(0 <= jt < 256 and 0 <= jf < 256 for _, jt, jf, _ in out)
    return b"".join(struct.pack("<HBBI", *ins) for ins in out)


def filter_fd(machine: str | None = None) -> int | None:
    """A pipe read end holding the filter (for `bwrap --seccomp FD`), or None."""
    data = build_filter(machine)
    if data is None:
        return None
    r, w = os.pipe()
    os.write(w, data)  # a few hundred bytes: fits the pipe buffer
    os.close(w)
    return r
