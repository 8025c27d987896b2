"""Ray backend: each execution is a Ray task that runs the same local sandbox on a node with room.

    Sandbox(backend="ray", cpus=1, memory_mb=4096)   # ray.init() here unless already running
    RAY_ADDRESS=ray://head:10001 python experiments/run.py ... --config.env.backend=ray

What goes where, and why:
- **Execution** happens on whichever node has `cpus` CPUs and `memory_mb` of memory free (the
  task's resource request is the run's own limits), inside the node's own sandbox
  (`inner`: bubblewrap by default, so a Ray worker is no way around the isolation; the worker
  itself only runs this module's trusted code). Δt is the program's own wall-clock, measured
  by the launcher on the node.
- **Data**: the split's input directory (public files only: train, unlabelled test, sample
  submission; the reward split's answers and the test answers live in `private/`/`reward/`
  outside it) is packed once per content into a tar in Ray's object store, keyed by its
  sha256; a node unpacks it once into `<node tmp>/rl4mle_jax-ray/inputs/<sha256>/` (checked
  against the digest, unpacked with tarfile's "data" filter, renamed into place atomically) and
  reuses it for every later run. Nodes never see answers.
- **Grading** happens on the host that started the run, the only place answers exist: the
  node reads the submission with the same no-links, regular-file-only, bounded read as a local
  run (`env.submission.read_run_submission`, under the global 64 MiB ceiling; the task's own cap
  is applied on the host), deletes the run dir, and returns the bytes with the result. Nothing
  of a run is left on the node.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import sys
import tarfile
import tempfile
import threading
from pathlib import Path
from typing import Any

from rl4mle_jax.env.sandbox.common import Limits
from rl4mle_jax.env.sandbox.result import ExecResult, RemoteSubmission

_INPUTS = "inputs"
_NODE_SANDBOXES: dict[tuple, Any] = {}  # per Ray worker process: (inner, limits) -> Sandbox


def import_ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise ImportError("the 'ray' sandbox backend needs Ray: pip install -e \".[ray]\"") from e
    return ray


def pack_input(input_dir: Path) -> tuple[str, bytes]:
    """(sha256, tar bytes) of a split's input dir: regular files and directories only."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for dirpath, dirs, files in os.walk(input_dir, followlinks=False):
            dirs.sort()
            for name in sorted(files) + [d for d in dirs
                                         if os.path.islink(os.path.join(dirpath, d))]:
                path = Path(dirpath) / name
                if path.is_symlink() or not path.is_file():
                    raise ValueError(f"{path}: the ray backend ships regular files only (a "
                                     "task's input has no links or special files)")
                info = tar.gettarinfo(str(path), arcname=str(path.relative_to(input_dir)))
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = 0  # the digest is of the content, not of when it was prepared
                with open(path, "rb") as f:
                    tar.addfile(info, f)
    data = buf.getvalue()
    return hashlib.sha256(data).hexdigest(), data


def node_input_dir(root: Path, digest: str, fetch: Any) -> Path:
    """This node's unpacked copy of the input `digest`; `fetch()` gives the tar if missing."""
    final = root / _INPUTS / digest
    if final.is_dir():
        return final
    data = fetch()
    if hashlib.sha256(data).hexdigest() != digest:
        raise ValueError(f"input {digest[:12]}: the bytes received do not match their digest")
    (root / _INPUTS).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{digest[:12]}-", dir=root / _INPUTS))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        tar.extractall(tmp, filter="data")
    for dirpath, _, files in os.walk(tmp):  # the sandbox uid reads it: o+r, dirs o+rx
        os.chmod(dirpath, 0o755)
        for name in files:
            os.chmod(os.path.join(dirpath, name), 0o444)
    try:
        os.rename(tmp, final)
    except OSError:  # another run on this node unpacked it first
        if not final.is_dir():
            raise
        from rl4mle_jax.env.sandbox.runfs import remove_tree

        remove_tree(tmp)
    return final


def run_on_node(code: str, digest: str, input_ref: list, limits: dict, env: dict | None,
                inner: str) -> dict[str, Any]:
    """The Ray task: run `code` in this node's sandbox, read the submission, clean up."""
    from rl4mle_jax.env.sandbox import Sandbox
    from rl4mle_jax.env.submission import MAX_BYTES, read_run_submission, submission_present

    ray = import_ray()
    root = Path(tempfile.gettempdir()) / "rl4mle_jax-ray"
    input_dir = node_input_dir(root, digest, lambda: ray.get(input_ref[0]))
    key = (inner, tuple(sorted(limits.items())))
    sandbox = _NODE_SANDBOXES.get(key)
    if sandbox is None:  # a Ray worker runs many tasks: set the backend up (and check it) once
        lim = Limits(**limits)
        sandbox = Sandbox(inner, timeout_s=lim.timeout_s, memory_mb=lim.memory_mb,
                          cpus=lim.cpus, max_procs=lim.max_procs, max_file_mb=lim.max_file_mb,
                          output_bytes=lim.output_bytes, disk_mb=lim.disk_mb,
                          max_inodes=lim.max_inodes, nice=lim.nice, python=sys.executable,
                          work_root=root / "runs", max_concurrency=1)
        _NODE_SANDBOXES[key] = sandbox
    res = sandbox.run(code, input_dir, env=env)
    try:
        sub = RemoteSubmission(submission_present(res.workdir),
                               read_run_submission(res.workdir, MAX_BYTES))
    finally:
        res.cleanup()
    out = {f.name: getattr(res, f.name) for f in dataclasses.fields(res)}
    out.update(remote_submission=sub, node=ray.get_runtime_context().get_node_id())
    return out


class RayBackend:
    """Runs each program as a Ray task (see the module docstring)."""

    name = "ray"

    def __init__(self, work_root: Path, inner: str = "bwrap", address: str | None = None):
        ray = import_ray()
        if not ray.is_initialized():
            ray.init(address=address or os.environ.get("RAY_ADDRESS") or None,
                     include_dashboard=False, log_to_driver=False)
        self._ray = ray
        self.inner = inner
        self.work_root = work_root
        self._remote = ray.remote(run_on_node)
        self._lock = threading.Lock()
        self._inputs: dict[str, tuple[str, Any]] = {}  # input dir -> (digest, object ref)
        self.puts = 0  # inputs shipped to the object store (once per content)

    def _input(self, input_dir: Path) -> tuple[str, Any]:
        from rl4mle_jax.env.sandbox.staging import _digest

        key = f"{Path(input_dir).resolve()}:{_digest(Path(input_dir))}"  # stat-level, cheap
        with self._lock:
            if key not in self._inputs:
                digest, data = pack_input(Path(input_dir))
                self._inputs[key] = (digest, self._ray.put(data))
                self.puts += 1
            return self._inputs[key]

    def run(self, code: str, input_dir: Path, limits: Limits, env: dict[str, str] | None,
            workdir: Path | None) -> ExecResult:
        if workdir is not None:
            raise ValueError("the ray backend runs in the node's own work root; workdir= is "
                             "for local backends")
        digest, ref = self._input(input_dir)
        opts: dict[str, Any] = {"num_cpus": limits.cpus, "max_retries": 0}
        if limits.memory_mb:
            opts["memory"] = int(limits.memory_mb) << 20
        # The ref inside a list is not fetched by Ray: the node fetches it only when it has not
        # unpacked this input yet, so data crosses the network once per node.
        out = self._ray.get(self._remote.options(**opts).remote(
            code, digest, [ref], dataclasses.asdict(limits), env, self.inner))
        node = out.pop("node")
        res = ExecResult(**{**out, "backend": "ray",
                            # the run dir was on the node and is gone; nothing here to clean
                            "workdir": self.work_root / "ray-run-on-node",
                            "submission_path": Path("submission/submission.csv")})
        res.warnings = [*res.warnings, f"ray: ran on node {node[:12]} ({self.inner})"]
        return res
