"""Orbax checkpoints of the whole train state plus JSON metadata.

Layout: <directory>/<step>/{state, meta}. `meta` holds what a restart needs besides arrays:
the config (as a JSON-able dict), the step and the policy version. Restoring takes an abstract
tree (ShapeDtypeStructs carrying shardings), so a state saved on one mesh shape restores onto
another.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp


def _jsonable(x: Any) -> Any:
    """Best-effort conversion of configs (ConfigDict, dataclasses, numpy scalars) to JSON."""
    if hasattr(x, "to_dict"):
        x = x.to_dict()
    if hasattr(x, "__dataclass_fields__"):
        x = {k: getattr(x, k) for k in x.__dataclass_fields__}
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.generic,)):
        return x.item()
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return repr(x)


def abstract_like(tree: Any) -> Any:
    """ShapeDtypeStructs (with each array's sharding) for a tree of arrays."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
        tree)


class CheckpointManager:
    """Keeps the last `max_to_keep` checkpoints of a train state; saves are asynchronous.

    Use as a context manager, or call `close()` (which waits for pending saves).
    """

    def __init__(self, directory: str | os.PathLike, max_to_keep: int = 3,
                 async_save: bool = True, save_interval_steps: int = 1):
        if max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1, got {max_to_keep}")
        self.directory = os.path.abspath(os.fspath(directory))
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, create=True, enable_async_checkpointing=async_save,
            save_interval_steps=save_interval_steps)
        self._mngr = ocp.CheckpointManager(self.directory, options=options)

    def save(self, step: int, state: Any, metadata: dict[str, Any] | None = None,
             force: bool = False, *, policy_version: int | None = None) -> bool:
        """Starts saving `state` (any pytree of arrays) at `step`; returns whether it saves.

        metadata: JSON-able extras (configs may be dataclasses or ConfigDicts); "step" and
        "policy_version" (when given) are added.
        """
        meta = {"step": int(step), **_jsonable(metadata or {})}
        if policy_version is not None:
            meta["policy_version"] = int(policy_version)
        json.dumps(meta)  # fail here, not in a background thread
        return self._mngr.save(
            int(step), force=force,
            args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                    meta=ocp.args.JsonSave(meta)))

    def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, dict]:
        """(state, metadata) at `step` (default: latest), laid out as `abstract_state` says.

        abstract_state: tree of jax.ShapeDtypeStruct with `sharding` set (see `abstract_like`,
        or `Learner.abstract_state()`); the tree structure must match the saved one.
        """
        self._mngr.wait_until_finished()
        if step is None:
            step = self._mngr.latest_step()
            if step is None:
                raise FileNotFoundError(f"no checkpoint in {self.directory}")
        elif step not in self._mngr.all_steps():
            raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory}; "
                                    f"available: {sorted(self._mngr.all_steps())}")
        out = self._mngr.restore(
            int(step), args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                                               meta=ocp.args.JsonRestore()))
        return out["state"], dict(out["meta"])

    def restore_metadata(self, step: int | None = None) -> dict:
        """Only the JSON metadata (e.g. to rebuild the config before the arrays)."""
        self._mngr.wait_until_finished()
        step = self._mngr.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        out = self._mngr.restore(int(step), args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return dict(out["meta"])

    def latest_step(self) -> int | None:
        return self._mngr.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self._mngr.all_steps())

    def wait_until_finished(self) -> None:
        self._mngr.wait_until_finished()

    def close(self) -> None:
        self._mngr.wait_until_finished()
        self._mngr.close()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
