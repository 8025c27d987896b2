"""The host allocator choice (rl4mle_jax/allocator.py): entry points re-execute themselves under
tcmalloc where it is installed, keep glibc when asked, and name a bad choice."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rl4mle_jax import allocator

ROOT = Path(__file__).resolve().parents[1]
TCMALLOC = allocator.find_tcmalloc()

# A stand-in entry point: re-executes like experiments/run.py, then reports what it runs under,
# its pid and its arguments (so the re-exec is seen to keep both).
_PROBE = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {root!r})
    from rl4mle_jax.allocator import loaded_allocator, reexec_with_tcmalloc
    if __name__ == "__main__":
        print("before", os.getpid(), flush=True)
        reexec_with_tcmalloc()
        print("after", os.getpid(), loaded_allocator(), sys.argv[1:], flush=True)
""")


def _probe(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    script = tmp_path / "entry.py"
    script.write_text(_PROBE.format(root=str(ROOT)))
    e = {k: v for k, v in os.environ.items()
         if k not in ("LD_PRELOAD", allocator.ENV, "RL4MLE_MALLOC_REEXEC")}
    e.update(env)
    return subprocess.run([sys.executable, str(script), "--flag", "x y"], env=e,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(TCMALLOC is None, reason="tcmalloc is not installed here")
def test_entry_point_reexecs_under_tcmalloc(tmp_path):
    out = _probe(tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    # "before" twice: once in glibc, once after the exec; same pid, same arguments
    assert [ln.split()[0] for ln in lines] == ["before", "before", "after"]
    pid = lines[0].split()[1]
    after = lines[2].split(maxsplit=3)
    assert after[1] == pid and "tcmalloc" in after[2]
    assert after[3] == "['--flag', 'x y']"


def test_system_keeps_glibc_without_reexec(tmp_path):
    out = _probe(tmp_path, RL4MLE_MALLOC="system")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [ln.split()[0] for ln in lines] == ["before", "after"]
    assert lines[1].split()[2] == "glibc"
    assert "tcmalloc not found" not in out.stderr


def test_already_preloaded_is_not_reexecuted(tmp_path):
    if TCMALLOC is None:
        pytest.skip("tcmalloc is not installed here")
    out = _probe(tmp_path, LD_PRELOAD=TCMALLOC)
    assert out.returncode == 0, out.stderr
    assert [ln.split()[0] for ln in out.stdout.splitlines()] == ["before", "after"]


def test_bad_choice_is_named(tmp_path):
    out = _probe(tmp_path, RL4MLE_MALLOC=str(tmp_path / "nope.so"))
    assert out.returncode != 0
    assert "RL4MLE_MALLOC" in out.stderr and "nope.so" in out.stderr


def test_missing_tcmalloc_warns_and_runs_on(monkeypatch, capsys):
    monkeypatch.setattr(allocator, "find_tcmalloc", lambda: None)
    monkeypatch.delenv(allocator.ENV, raising=False)
    monkeypatch.setattr(allocator, "loaded_allocator", lambda: "glibc")
    execs = []
    monkeypatch.setattr(os, "execve", lambda *a: execs.append(a))
    allocator.reexec_with_tcmalloc()
    assert execs == []
    assert "libtcmalloc-minimal4" in capsys.readouterr().err


def test_reexec_environment(monkeypatch):
    """What the exec gets: the library first in LD_PRELOAD (others kept), the guard set to
    this pid, the interpreter and the original arguments."""
    monkeypatch.setenv(allocator.ENV, "/bin/true")  # any existing file stands for a library
    monkeypatch.setenv("LD_PRELOAD", "libother.so")
    monkeypatch.delenv("RL4MLE_MALLOC_REEXEC", raising=False)
    monkeypatch.setattr(allocator, "loaded_allocator", lambda: "glibc")
    monkeypatch.setattr(sys, "orig_argv", ["python", "-X", "dev", "run.py", "--a=1"])
    calls = []
    monkeypatch.setattr(os, "execve", lambda exe, argv, env: calls.append((exe, argv, env)))
    allocator.reexec_with_tcmalloc()
    exe, argv, env = calls[0]
    assert exe == sys.executable and argv == [sys.executable, "-X", "dev", "run.py", "--a=1"]
    assert env["LD_PRELOAD"] == "/bin/true:libother.so"
    assert env["RL4MLE_MALLOC_REEXEC"] == str(os.getpid())
    # the guard stops a second attempt in the same process (a library that failed to load)
    monkeypatch.setenv("RL4MLE_MALLOC_REEXEC", str(os.getpid()))
    allocator.reexec_with_tcmalloc()
    assert len(calls) == 1


def test_module_cli():
    out = subprocess.run([sys.executable, "-m", "rl4mle_jax.allocator", "--check"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == (0 if TCMALLOC else 1)
    env = {**os.environ, allocator.ENV: "system"}
    out = subprocess.run([sys.executable, "-m", "rl4mle_jax.allocator"], env=env,
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stdout == ""
