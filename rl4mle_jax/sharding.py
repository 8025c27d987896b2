"""Device mesh, logical-axis rules, and the shardings derived from them.

Parameters carry logical axis names ("embed", "heads", ...; see `models.param_logical_axes`).
A rules table maps each logical name to zero, one or several mesh axes. Shardings are declared
once, here, from those names.

Divisibility rule: for a dimension of size n mapped to mesh axes (a1, a2, ...), we keep the
longest prefix (a1, ..., ak) whose product of mesh sizes divides n and drop the rest; a mesh
axis already used by an earlier dimension of the same array is dropped too (an array may use
each mesh axis once). Such a dimension is then (partly) replicated instead of failing, e.g.
Qwen2.5's 2 KV heads on a tensor axis of 4.

With `sampler_devices` > 0 (`make_meshes`) the devices are split in two disjoint meshes: the
first devices sample (policy and frozen copy), the rest learn, so sampling never waits for a
train step. The sampler's mesh is all "tensor": its prompts arrive unsharded from the host, so
a data axis there would only repeat the same work on every device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

MeshAxes = str | tuple[str, ...] | None
Rules = tuple[tuple[str, MeshAxes], ...]

# Logical name -> mesh axes. Weights are sharded over fsdp on their "embed" side and over
# tensor on their heads/mlp/vocab side (Megatron-style column/row split); batch-like
# dimensions go over data and fsdp (fsdp shards the batch too, as in ZeRO-3).
DEFAULT_RULES: Rules = (
    ("batch", BATCH_AXES),
    ("length", None),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("norm", None),
    ("value", None),
)


def make_mesh(
    data: int = -1, fsdp: int = 1, tensor: int = 1, devices: Sequence[jax.Device] | None = None
) -> Mesh:
    """A ("data", "fsdp", "tensor") mesh; one size may be -1 (all remaining devices)."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = [data, fsdp, tensor]
    if sum(s == -1 for s in sizes) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got data={data} fsdp={fsdp} "
                         f"tensor={tensor}")
    if any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"mesh axis sizes must be positive or -1, got data={data} fsdp={fsdp} "
                         f"tensor={tensor}")
    known = int(np.prod([s for s in sizes if s != -1]))
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(f"{len(devices)} devices are not divisible by the fixed mesh axes "
                             f"(product {known}) of data={data} fsdp={fsdp} tensor={tensor}")
        sizes[sizes.index(-1)] = len(devices) // known
    total = int(np.prod(sizes))
    if total > len(devices):
        raise ValueError(f"mesh data={sizes[0]} fsdp={sizes[1]} tensor={sizes[2]} needs {total} "
                         f"devices, only {len(devices)} available")
    grid = np.asarray(devices[:total], dtype=object).reshape(sizes)
    return Mesh(grid, MESH_AXES)


@dataclasses.dataclass(frozen=True)
class Meshes:
    """The learner's mesh and the sampler's (None: one mesh, sampler and learner take turns)."""

    learner: Mesh
    sampler: Mesh | None = None


def make_meshes(data: int = -1, fsdp: int = 1, tensor: int = 1, sampler_devices: int = 0,
                devices: Sequence[jax.Device] | None = None) -> Meshes:
    """The learner's (data, fsdp, tensor) mesh on the devices after the first
    `sampler_devices`, and a tensor-parallel sampler mesh on those (0: one mesh of all)."""
    devices = list(jax.devices() if devices is None else devices)
    if sampler_devices == 0:
        return Meshes(make_mesh(data, fsdp, tensor, devices))
    if not 0 < sampler_devices < len(devices):
        raise ValueError(f"sampler_devices={sampler_devices} must leave at least one of the "
                         f"{len(devices)} devices to the learner (0: share all of them)")
    return Meshes(learner=make_mesh(data, fsdp, tensor, devices[sampler_devices:]),
                  sampler=make_mesh(1, 1, sampler_devices, devices[:sampler_devices]))


def _rule_lookup(rules: Rules) -> dict[str, tuple[str, ...]]:
    table: dict[str, tuple[str, ...]] = {}
    for name, axes in rules:
        if axes is None:
            table[name] = ()
        elif isinstance(axes, str):
            table[name] = (axes,)
        else:
            table[name] = tuple(axes)
    return table


def logical_to_spec(
    logical_axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
    rules: Rules = DEFAULT_RULES,
) -> PartitionSpec:
    """PartitionSpec for one array from its logical axis names (see the module docstring)."""
    if len(logical_axes) != len(shape):
        raise ValueError(f"logical axes {tuple(logical_axes)} do not match shape {tuple(shape)}")
    table = _rule_lookup(rules)
    used: set[str] = set()
    spec: list[Any] = []
    for name, dim in zip(logical_axes, shape):
        if name is None:
            spec.append(None)
            continue
        if name not in table:
            raise KeyError(f"logical axis {name!r} has no rule; known: {sorted(table)}")
        kept: list[str] = []
        prod = 1
        for ax in table[name]:
            if ax not in mesh.shape:
                raise KeyError(f"rule for {name!r} names mesh axis {ax!r}, mesh has "
                               f"{tuple(mesh.axis_names)}")
            if ax in used or dim % (prod * mesh.shape[ax]):
                break
            kept.append(ax)
            prod *= mesh.shape[ax]
        used.update(kept)
        spec.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    return PartitionSpec(*spec)


def _is_axes_leaf(x: Any) -> bool:
    return isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)


def logical_to_sharding(
    logical_axes_tree: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES, shapes: Any = None
) -> Any:
    """NamedSharding tree from a tree of logical-axis tuples.

    shapes: a tree of the same structure whose leaves have `.shape` (arrays or
    ShapeDtypeStructs), used for the divisibility rule. Without it no axis is dropped
    (so use it whenever dimensions might not divide the mesh).
    """
    if shapes is None:
        return jax.tree.map(
            lambda axes: NamedSharding(mesh, logical_to_spec(axes, [0] * len(axes), mesh, rules)),
            logical_axes_tree, is_leaf=_is_axes_leaf)
    flat_axes, treedef = jax.tree.flatten(logical_axes_tree, is_leaf=_is_axes_leaf)
    flat_shapes = treedef.flatten_up_to(shapes)
    out = []
    for (axes, leaf) in zip(flat_axes, flat_shapes):
        out.append(NamedSharding(mesh, logical_to_spec(axes, leaf.shape, mesh, rules)))
    return treedef.unflatten(out)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh, rules: Rules = DEFAULT_RULES) -> NamedSharding:
    """Leading (batch) dimension over the batch mesh axes; valid for arrays of any rank >= 1."""
    axes = _rule_lookup(rules)["batch"]
    return NamedSharding(mesh, PartitionSpec(axes if len(axes) != 1 else axes[0]))


def batch_divisor(mesh: Mesh, rules: Rules = DEFAULT_RULES) -> int:
    """Batch sizes (and micro-batch sizes) must be multiples of this."""
    return int(np.prod([mesh.shape[a] for a in _rule_lookup(rules)["batch"]]))


def with_batch_constraint(x: jax.Array, mesh: Mesh, rules: Rules = DEFAULT_RULES,
                          batch_dim: int = 0) -> jax.Array:
    """Inside jit: pin dimension `batch_dim` of x to the batch mesh axes."""
    axes = _rule_lookup(rules)["batch"]
    spec = [None] * x.ndim
    spec[batch_dim] = axes if len(axes) != 1 else axes[0]
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec(*spec)))
