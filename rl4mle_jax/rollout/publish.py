"""Weight publishing: each new policy version from the learner to the sampler.

With the devices split (`mesh.sampler_devices`, `sharding.make_meshes`) the learner trains on
its own mesh and, after each update, publishes the new params: one `jax.device_put` onto the
sampler mesh's shardings, dispatched asynchronously, so the learner does not wait for the copy
and the sampler's next call waits for the copy only, never for a train step. The generation
services read `latest()` once per batched sampler call: a call runs wholly under one version,
and each Generation carries the version of the weights that produced it (the sampler switches
versions between requests, not between decode steps).

With several JAX processes (rl4mle_jax/spmd.py) the samplers run on process 0's first device:
publishing brings the params there (without communication where process 0 holds a replica).

With one mesh, publishing hands the learner's own arrays on, without a copy: sampler and
learner take turns on one device lane, so a train step never donates arrays that a sampler
call is still reading.
"""

from __future__ import annotations

import threading
from typing import Any

import jax

from rl4mle_jax import distributed, models
from rl4mle_jax import sharding as shd


def param_shardings(model_config: models.Qwen2Config, mesh: jax.sharding.Mesh,
                    rules: shd.Rules = shd.DEFAULT_RULES) -> Any:
    """Policy-param shardings on `mesh` from the params' logical axes (as the learner's)."""
    abstract = jax.eval_shape(lambda k: models.init_params(model_config, k),
                              jax.random.PRNGKey(0))
    return shd.logical_to_sharding(models.param_logical_axes(model_config), mesh, rules,
                                   abstract)


class WeightPublisher:
    """The latest published `(params, version)` on the sampler's devices.

    Args:
      shardings: the param shardings of the sampler mesh; None (one mesh): no copy.
    """

    def __init__(self, shardings: Any = None):
        self.shardings = shardings
        self._latest: tuple[Any, int] | None = None
        self._lock = threading.Lock()
        self.published = 0  # publish() calls

    def place(self, params: Any) -> Any:
        """params on the sampler's devices (the same arrays with one mesh). Learner params that
        span several processes come to this one first (`distributed.to_local`: every process
        calls it at the same point, rl4mle_jax/spmd.py)."""
        if self.shardings is None:
            return params
        if any(isinstance(x, jax.Array) and not x.is_fully_addressable
               for x in jax.tree.leaves(params)):
            params = distributed.to_local(params)
        return jax.device_put(params, self.shardings)

    def publish(self, params: Any, version: int) -> None:
        """Make `params` (policy version `version`) the sampler's from its next call on."""
        placed = self.place(params)
        with self._lock:
            if self._latest is not None and version < self._latest[1]:
                raise ValueError(f"version {version} published after {self._latest[1]}")
            self._latest = (placed, version)
            self.published += 1

    def latest(self) -> tuple[Any, int]:
        """(params, version) of the last publish; one read, so the pair is consistent."""
        with self._lock:
            if self._latest is None:
                raise RuntimeError("no weights published yet")
            return self._latest
