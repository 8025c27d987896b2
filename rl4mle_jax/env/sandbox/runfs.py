"""The run directory on the host: its size-limited filesystem, inspection and removal.

- `mount_run_fs`: as root, a tmpfs of `size=<disk_mb>M,nr_inodes=<max_inodes>` (nosuid, nodev)
  on the fresh run dir bounds the bytes and inodes the whole run can write (the program just
  gets ENOSPC). Its pages are charged to the memory cgroup of whoever writes them, i.e. the
  run's (cgroups.py), so memory_mb covers them too. Unprivileged: no mount; the watchdog scans
  the run dir instead (watchdog.py), and RLIMIT_FSIZE bounds each file.
- `regular_submission`: the host never follows a link inside the run dir.
- `remove_tree`: iterative, fd-relative, linear in entries, indifferent to depth (no PATH_MAX),
  modes 000 and chmod'ed files; a tmpfs run dir is lazily unmounted (instant) and rmdir'ed.
- `walk`: an iterative os.walk (3.11's recurses) for the trusted input dir.
A run dir the caller never cleans up is unmounted when the host exits (atexit), and one left by
a killed host by the next start's `sweep_run_fs` (the mount source names the host).
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import logging
import os
import re
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

from rl4mle_jax.env.sandbox.cgroups import host_tag, stale_host

log = logging.getLogger(__name__)

_MS_NOSUID, _MS_NODEV = 2, 4
_MNT_DETACH = 2
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
SOURCE = "rl4mle_run-"
_EXIT_HOOK: list[bool] = []
_HOOK_LOCK = threading.Lock()


def mount_run_fs(path: Path, disk_mb: int | None, max_inodes: int | None) -> bool:
    """Mount a bounded tmpfs on `path` (root only); False when not root or no limit asked."""
    if os.geteuid() != 0 or not (disk_mb or max_inodes):
        return False
    opts = ["mode=0755"]
    if disk_mb:
        opts.append(f"size={int(disk_mb)}m")
    if max_inodes:
        opts.append(f"nr_inodes={int(max_inodes)}")
    with _HOOK_LOCK:
        if not _EXIT_HOOK:
            atexit.register(_unmount_ours)
            _EXIT_HOOK.append(True)
    rc = _libc.mount(f"{SOURCE}{host_tag()}".encode(), str(path).encode(), b"tmpfs",
                     _MS_NOSUID | _MS_NODEV, ",".join(opts).encode())
    if rc != 0:
        err = ctypes.get_errno()
        log.warning("sandbox: cannot mount a tmpfs on %s (%s); disk bounded by the watchdog",
                    path, os.strerror(err))
        return False
    return True


def _run_mounts() -> list[tuple[str, str]]:
    """(mount point, host tag) of the run-dir tmpfs mounts in our mount namespace."""
    out = []
    try:
        text = open("/proc/self/mountinfo").read()
    except OSError:
        return out
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        r = right.split()
        if len(r) >= 2 and r[0] == "tmpfs" and r[1].startswith(SOURCE):
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), left.split()[4])
            out.append((point, r[1][len(SOURCE):]))
    return out


def _unmount_ours() -> None:
    tag = host_tag()
    for point, owner in _run_mounts():
        if owner == tag:
            remove_tree(Path(point))


def sweep_run_fs() -> int:
    """Remove run dirs (tmpfs mounts) of hosts that died; returns how many."""
    n = 0
    for point, owner in _run_mounts():
        if stale_host(owner):
            n += remove_tree(Path(point))
    return n


def is_run_fs(path: Path) -> bool:
    """Is `path` one of our tmpfs mounts (its own filesystem, not its parent's)?"""
    try:
        return os.lstat(path).st_dev != os.lstat(path.parent).st_dev
    except OSError:
        return False


def regular_submission(workdir: Path) -> bool:
    """submission/submission.csv is a regular file reached through no symlink."""
    try:
        fd = os.open(workdir / "submission", _DIR_FLAGS)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.stat("submission.csv", dir_fd=fd, follow_symlinks=False).st_mode)
    except OSError:
        return False
    finally:
        os.close(fd)


def _empty_dir(fd: int) -> list[str]:
    """Unlink every non-directory in the directory `fd`; return its subdirectory names."""
    subdirs = []
    with os.scandir(fd) as it:
        names = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
    for name, is_dir in names:
        if is_dir:
            subdirs.append(name)
            continue
        try:
            os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            pass
    return subdirs


def _open_subdir(parent: int, name: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except PermissionError:  # mode 000 (as non-root): it is a real dir (lstat said so)
        os.chmod(name, 0o700, dir_fd=parent)
        return os.open(name, _DIR_FLAGS, dir_fd=parent)


def _remove_contents(top: Path) -> None:
    """Delete everything below `top`: depth-first, one fd open at a time, '..' to climb back."""
    fd = os.open(top, _DIR_FLAGS)
    dev = os.fstat(fd).st_dev
    os.fchmod(fd, 0o700)
    stack: list[list[str]] = [_empty_dir(fd)]  # per level: subdirs still to remove
    names: list[str] = []  # the path from top, one name per level
    try:
        while stack:
            if stack[-1]:
                name = stack[-1].pop()
                try:
                    child = _open_subdir(fd, name)
                except FileNotFoundError:
                    continue
                if os.fstat(child).st_dev != dev:  # a mount point: never cross it
                    os.close(child)
                    continue
                if os.fstat(child).st_mode & 0o700 != 0o700:
                    os.fchmod(child, 0o700)
                os.close(fd)
                fd = child
                names.append(name)
                stack.append(_empty_dir(fd))
                continue
            stack.pop()
            if not names:
                break
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            try:
                os.rmdir(names.pop(), dir_fd=fd)
            except FileNotFoundError:
                pass
    finally:
        os.close(fd)


def remove_tree(path: Path) -> bool:
    """Remove a run dir whatever the program made of it; never raises. True when it is gone."""
    try:
        if not os.path.lexists(path):
            return True
        if is_run_fs(path):
            if _libc.umount2(str(path).encode(), _MNT_DETACH) != 0:
                log.warning("sandbox: umount %s: %s", path, os.strerror(ctypes.get_errno()))
        if os.path.islink(path) or not os.path.isdir(path):
            os.unlink(path)
            return True
        if not is_run_fs(path):
            _remove_contents(path)
        os.rmdir(path)
        return True
    except Exception as e:  # cleanup is best effort and must never take the caller down
        log.warning("sandbox: could not remove %s: %r", path, e)
        return False


def walk(top: Path) -> Iterator[tuple[str, list[str], list[str]]]:
    """os.walk(top) without recursion and without following links (top-down)."""
    todo = [str(top)]
    while todo:
        d = todo.pop()
        dirs, files = [], []
        try:
            with os.scandir(d) as it:
                for e in it:
                    (dirs if e.is_dir(follow_symlinks=False) else files).append(e.name)
        except OSError:
            continue
        yield d, dirs, files
        todo.extend(os.path.join(d, n) for n in reversed(dirs))
