"""tcmalloc for the host process: XLA:CPU's large temporaries without a page fault per page.

XLA:CPU allocates each execution's buffers with the C allocator. glibc serves allocations above
32 MiB with mmap and returns them to the kernel on free, so a step re-faults (and the kernel
re-zeroes) every page of its large temporaries each time: the default run's train step needs
its logits (batch x length x vocab floats, ~130 MB at its shapes) and their gradient several
times over. Measured here (scripts/bench_allocator.py, one process per allocator, interleaved):
the train step alone spent as much CPU in the kernel as in user code, ~9 M minor faults in 6
steps, and ran 2.1-2.8x faster under tcmalloc, which keeps freed memory for reuse.

The allocator is fixed when a process starts (LD_PRELOAD), so entry points call
`reexec_with_tcmalloc()` before anything else: where tcmalloc is installed and not yet loaded,
the process replaces itself (same pid, same command line) with one that preloads it. Programs
in the sandbox never get it: their environment is built from nothing (sandbox/common.py).

RL4MLE_MALLOC: unset or "tcmalloc" (the default: tcmalloc when found), "system" (glibc; no
re-exec), or a path to another allocator's shared library.
"""

from __future__ import annotations

import ctypes.util
import glob
import os
import sys

ENV = "RL4MLE_MALLOC"
_GUARD = "RL4MLE_MALLOC_REEXEC"  # the pid that re-executed itself (exec keeps the pid)
_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
_DIRS = ("/usr/lib/*-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib", "/lib/*-linux-gnu")
INSTALL_HINT = "apt-get install libtcmalloc-minimal4 (Debian/Ubuntu) or gperftools"


def find_tcmalloc() -> str | None:
    """The path of an installed tcmalloc, or None."""
    for d in _DIRS:
        for name in _NAMES:
            hits = sorted(glob.glob(os.path.join(d, name)))
            if hits:
                return hits[0]
    for lib in ("tcmalloc_minimal", "tcmalloc"):
        found = ctypes.util.find_library(lib)
        if found:
            return found
    return None


def loaded_allocator() -> str:
    """What serves this process's malloc: the preloaded library's path, or "glibc"."""
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return "unknown"
    for line in maps.splitlines():
        parts = line.split(maxsplit=5)
        path = parts[5] if len(parts) == 6 else ""
        base = os.path.basename(path)
        if base.startswith(("libtcmalloc", "libjemalloc", "libmimalloc")):
            return path
    return "glibc"


def _choice() -> str:
    return os.environ.get(ENV, "tcmalloc").strip()


def wanted() -> str | None:
    """The library RL4MLE_MALLOC asks for (None: keep the system allocator)."""
    choice = _choice()
    if choice == "system":
        return None
    if choice in ("", "tcmalloc"):
        return find_tcmalloc()
    if not os.path.exists(choice):
        raise FileNotFoundError(f"{ENV}={choice!r}: no such file (use 'system', 'tcmalloc' or "
                                "the path of an allocator's shared library)")
    return choice


def reexec_with_tcmalloc() -> None:
    """Re-execute this process under the allocator `wanted()` names, unless it already runs
    under one (or a re-exec of this very process already tried). Call it first thing."""
    if os.environ.get(_GUARD) == str(os.getpid()) or loaded_allocator() != "glibc":
        return
    lib = wanted()
    if lib is None:
        if _choice() != "system":
            print(f"rl4mle_jax: tcmalloc not found ({INSTALL_HINT}); on CPU the train step ran "
                  "1.4-2.8x slower with glibc malloc (scripts/bench_allocator.py). "
                  f"{ENV}=system silences this.", file=sys.stderr)
        return
    env = dict(os.environ)
    env["LD_PRELOAD"] = ":".join(p for p in (lib, env.get("LD_PRELOAD", "")) if p)
    env[_GUARD] = str(os.getpid())
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def main(argv: list[str]) -> int:
    """`python -m rl4mle_jax.allocator`: print the library RL4MLE_MALLOC selects (nothing for
    glibc); `--check`: exit 1 when tcmalloc is not installed."""
    if argv[1:] == ["--check"]:
        return 0 if find_tcmalloc() else 1
    lib = wanted()
    if lib:
        print(lib)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
