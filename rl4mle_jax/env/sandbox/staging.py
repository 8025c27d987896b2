"""Input staging: the data split as <work_root>/inputs/<digest>/, so no task path is shown.

Inside bwrap, /proc/self/mountinfo names the source of every bind mount, so binding the task's
own data dir would tell the program the absolute path of the task (and of its private answers
next to it). The sandbox binds a staged copy instead: hard links to the same inodes when the
data shares the work root's filesystem (no bytes copied), plain copies otherwise. The digest
covers each entry's relative path, type, inode, size and mtime, so an edited split gets a new
staging dir and an unchanged one is reused by every run. Symlinks are copied as links, never
followed (one pointing outside dangles in the sandbox, as before). Old staging dirs are left
for the next `sweep_staging` (entries unused for `max_age_s`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
import threading
import time
from pathlib import Path

from rl4mle_jax.env.sandbox.runfs import remove_tree, walk

STAGING = "inputs"
_LOCK = threading.Lock()
_KNOWN: dict[tuple[str, str], Path] = {}


def _digest(src: Path) -> str:
    h = hashlib.sha256()
    for dirpath, dirs, files in walk(src):
        rel = os.path.relpath(dirpath, src)
        for name in sorted(dirs + files):
            st = os.lstat(os.path.join(dirpath, name))
            link = os.readlink(os.path.join(dirpath, name)) if stat.S_ISLNK(st.st_mode) else ""
            h.update(repr((rel, name, st.st_mode, st.st_dev, st.st_ino, st.st_size,
                           st.st_mtime_ns, link)).encode())
    return h.hexdigest()[:32]


def _populate(src: Path, dst: Path) -> None:
    for dirpath, dirs, files in walk(src):
        out = dst / os.path.relpath(dirpath, src)
        for name in dirs:
            (out / name).mkdir()
        for name in files:
            s, d = os.path.join(dirpath, name), out / name
            if os.path.islink(s):
                os.symlink(os.readlink(s), d)
                continue
            try:
                os.link(s, d, follow_symlinks=False)
            except OSError:  # another filesystem, or protected_hardlinks for non-owners
                shutil.copy2(s, d, follow_symlinks=False)
                os.chmod(d, 0o444)
    for dirpath, _, _ in walk(dst):
        os.chmod(dirpath, 0o755)


def stage_input(input_dir: Path, work_root: Path) -> Path:
    """The staged copy of input_dir under work_root (made once per content, then reused)."""
    src = Path(input_dir).resolve()
    digest = _digest(src)
    key = (str(work_root), digest)
    with _LOCK:
        known = _KNOWN.get(key)
        if known is not None and known.is_dir():
            os.utime(known)
            return known
        root = Path(work_root) / STAGING
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o711)
        final = root / digest
        if not final.is_dir():  # another host process may be staging the same content
            tmp = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
            try:
                _populate(src, tmp)
                os.chmod(tmp, 0o755)
                os.rename(tmp, final)
            except OSError:
                remove_tree(tmp)
                if not final.is_dir():
                    raise
        os.utime(final)
        _KNOWN[key] = final
        return final


def sweep_staging(work_root: Path, max_age_s: float = 7 * 86400) -> int:
    """Delete staging dirs not used for max_age_s (and half-made ones); returns how many."""
    root = Path(work_root) / STAGING
    n = 0
    try:
        entries = list(os.scandir(root))
    except OSError:
        return 0
    now = time.time()
    for e in entries:
        try:
            age = now - e.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
        if age > max_age_s or (e.name.startswith(".staging-") and age > 3600):
            n += remove_tree(Path(e.path))
    return n
