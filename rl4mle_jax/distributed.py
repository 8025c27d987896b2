"""Several JAX processes (hosts) as one learner mesh: initialisation and host-to-global data.

One process per host, every process sees every device (`jax.devices()` is global after
`initialize`), and the learner's mesh spans all of them (`sharding.make_mesh` takes
`jax.devices()`). Jitted steps are SPMD over that mesh: every process must call the same steps
in the same order with the same global inputs.

- `initialize()` calls `jax.distributed.initialize` from arguments, from RL4MLE_COORDINATOR /
  RL4MLE_NUM_PROCESSES / RL4MLE_PROCESS_ID, or (with none of those) from JAX's own detection
  of TPU pod slices, SLURM and Open MPI; on CPU it selects gloo collectives first (the only
  cross-process CPU collectives).
- `to_global(tree, sharding)`: host arrays that are the same on every process become global
  jax.Arrays, each process supplying the shards of its own devices (jit refuses plain numpy
  with a sharding over other processes' devices). With one process it returns the tree as it is.
- `gather(tree)`: the full values on every process (metrics, checks, exports).
- `to_local(tree)`: the full values as numpy, without any communication where every process
  holds a whole replica (params on a data-only mesh), else gathered (every process calls it).
- `Channel`: process 0's commands to the others (rl4mle_jax/spmd.py) through the coordination
  service's key-value store, so a process waiting for the next command waits there, not inside
  a device collective (measured: the first gloo collective gives up on a peer 30 s late).
"""

from __future__ import annotations

import io
import json
import os
import threading
from typing import Any

import jax
import numpy as np

ENV = ("RL4MLE_COORDINATOR", "RL4MLE_NUM_PROCESSES", "RL4MLE_PROCESS_ID")


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, local_device_ids: Any = None) -> bool:
    """Join (or form) the process group; True when there is more than one process.

    Call before any other JAX work. Without arguments or RL4MLE_* variables, JAX's own cluster
    detection decides (a single process when it finds none).
    """
    coordinator_address = coordinator_address or os.environ.get(ENV[0])
    if num_processes is None and os.environ.get(ENV[1]):
        num_processes = int(os.environ[ENV[1]])
    if process_id is None and os.environ.get(ENV[2]):
        process_id = int(os.environ[ENV[2]])
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU only; else unused
    explicit = coordinator_address is not None
    if explicit and (num_processes is None or process_id is None):
        raise ValueError(f"{ENV[0]} / coordinator_address={coordinator_address!r} needs "
                         f"num_processes and process_id too ({ENV[1]}, {ENV[2]})")
    if explicit and num_processes == 1:
        return False
    try:
        jax.distributed.initialize(coordinator_address, num_processes, process_id,
                                   local_device_ids=local_device_ids)
    except ValueError:
        if explicit:
            raise
        return False  # no cluster detected: one process
    return jax.process_count() > 1


def to_global(tree: Any, sharding: jax.sharding.Sharding) -> Any:
    """Host arrays (identical on every process) as global arrays with `sharding`."""
    if jax.process_count() == 1:
        return tree

    def one(x: Any) -> Any:
        if isinstance(x, jax.Array):
            return x
        x = np.asarray(x)
        if x.ndim == 0:
            return x
        return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])

    return jax.tree.map(one, tree)


def gather(tree: Any) -> Any:
    """Every leaf's full value as numpy, on every process."""
    if jax.process_count() == 1:
        return jax.device_get(tree)
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)


def _whole_here(x: Any) -> bool:
    return not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated


def needs_gather(tree: Any) -> bool:
    """Whether `to_local(tree)` communicates (some leaf is whole on no single process)."""
    return not all(_whole_here(x) for x in jax.tree.leaves(tree))


def to_local(tree: Any) -> Any:
    """Every leaf's full value as numpy on this process: its own replica where every process
    holds one (no communication), else `gather` (then every process must call this, in the same
    order; the choice depends only on the shardings, which every process shares)."""
    if not needs_gather(tree):
        return jax.tree.map(lambda x: np.asarray(x.addressable_data(0))
                            if isinstance(x, jax.Array) and not x.is_fully_addressable
                            else np.asarray(x), tree)
    return gather(tree)


def _client() -> Any:
    from jax._src import distributed as jax_distributed

    client = jax_distributed.global_state.client
    if client is None:
        raise RuntimeError("jax.distributed is not initialised (distributed.initialize)")
    return client


def barrier(name: str, timeout_s: float = 3600.0) -> None:
    """Waits until every process reaches the barrier `name` (once per name and process group),
    through the coordination service: for points where one process may be minutes behind (a
    checkpoint to load), which a device collective would not wait for."""
    _client().wait_at_barrier(name, int(timeout_s * 1000))


class Channel:
    """Ordered commands from process 0 to every other process (a kind, JSON-able info and a
    dict of numpy arrays), through the coordination service's key-value store.

    Command n lives under `<name>/<n>/`: the arrays as one .npz in chunks of `CHUNK` bytes, then
    a JSON head (written last, so a reader that sees the head finds every chunk). `send` is
    thread-safe and numbers commands in the order it is called; every receiver reads them in
    that order. `forget(n)` deletes the keys of commands before n (call it only once every
    process has read them, e.g. after a step they all took part in).
    """

    CHUNK = 1 << 20  # bytes per value (the service's messages stay well under gRPC's limit)

    def __init__(self, name: str = "rl4mle/loop"):
        self.name, self.client = name, _client()
        self.next = 0  # the sender's next number, or the next one a receiver reads
        self._forgotten = 0
        self._lock = threading.Lock()

    def send(self, kind: str, arrays: dict[str, Any] | None = None, **info: Any) -> int:
        payload = b""
        if arrays:
            buf = io.BytesIO()
            np.savez(buf, **{k: np.asarray(v) for k, v in arrays.items()})
            payload = buf.getvalue()
        chunks = [payload[i:i + self.CHUNK] for i in range(0, len(payload), self.CHUNK)]
        head = json.dumps({"kind": kind, "info": info, "chunks": len(chunks)})
        with self._lock:
            n, self.next = self.next, self.next + 1
            for i, chunk in enumerate(chunks):
                self.client.key_value_set_bytes(f"{self.name}/{n}/{i}", chunk)
            self.client.key_value_set(f"{self.name}/{n}/head", head)
        return n

    def receive(self, poll_s: float = 60.0) -> tuple[str, dict[str, Any], dict[str, np.ndarray]]:
        """The next command: (kind, info, arrays). Waits as long as it takes: a process that
        dies is reported by the coordination service, which ends the others."""
        key = f"{self.name}/{self.next}/head"
        while True:
            try:
                head = json.loads(self.client.blocking_key_value_get(key, int(poll_s * 1000)))
                break
            except Exception as e:  # noqa: BLE001 - the client raises a generic runtime error
                if "DEADLINE_EXCEEDED" not in str(e) and "timed out" not in str(e).lower():
                    raise
        arrays: dict[str, np.ndarray] = {}
        if head["chunks"]:
            payload = b"".join(
                self.client.blocking_key_value_get_bytes(f"{self.name}/{self.next}/{i}",
                                                         int(poll_s * 1000))
                for i in range(head["chunks"]))
            with np.load(io.BytesIO(payload), allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
        self.next += 1
        return head["kind"], head["info"], arrays

    def forget(self, before: int) -> None:
        for n in range(self._forgotten, before):
            self.client.key_value_delete(f"{self.name}/{n}")
        self._forgotten = max(self._forgotten, before)
