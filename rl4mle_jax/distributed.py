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
"""

from __future__ import annotations

import os
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
