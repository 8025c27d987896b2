"""Mesh construction, logical-axis rules and the shardings derived from them (8 CPU devices)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from rl4mle_jax import models
from rl4mle_jax import sharding as shd
from rl4mle_jax.rl.state import make_optimizer, make_schedule, opt_state_shardings


def test_make_mesh_shapes_and_fill():
    mesh = shd.make_mesh(fsdp=2, tensor=4)
    assert mesh.axis_names == ("data", "fsdp", "tensor")
    assert dict(mesh.shape) == {"data": 1, "fsdp": 2, "tensor": 4}
    assert dict(shd.make_mesh(data=2, fsdp=-1).shape) == {"data": 2, "fsdp": 4, "tensor": 1}
    one = shd.make_mesh(devices=jax.devices()[:1])
    assert dict(one.shape) == {"data": 1, "fsdp": 1, "tensor": 1}


@pytest.mark.parametrize("kwargs, message", [
    (dict(data=-1, fsdp=-1), "at most one mesh axis may be -1"),
    (dict(data=3), "needs 3 devices"),
    (dict(data=-1, fsdp=3), "not divisible"),
    (dict(data=0), "must be positive"),
])
def test_make_mesh_errors(kwargs, message):
    devices = jax.devices()[:2] if kwargs.get("data") == 3 else None
    with pytest.raises(ValueError, match=message):
        shd.make_mesh(**kwargs, devices=devices)


def test_logical_to_spec_rules_and_divisibility():
    mesh = shd.make_mesh(data=1, fsdp=2, tensor=4)
    # q_proj kernel [H, nH, D]: embed -> fsdp, heads -> tensor, head_dim replicated.
    assert shd.logical_to_spec(("embed", "heads", "head_dim"), (64, 8, 16), mesh) == \
        P("fsdp", "tensor", None)
    # 2 KV heads do not divide tensor=4: that dimension is replicated instead.
    assert shd.logical_to_spec(("embed", "kv_heads", "head_dim"), (64, 2, 16), mesh) == \
        P("fsdp", None, None)
    # A 3-wide embed does not divide fsdp=2.
    assert shd.logical_to_spec(("vocab", "embed"), (12, 3), mesh) == P("tensor", None)
    # A batch of 4 on data×fsdp = 1×2 keeps both axes; the scalar spec is empty.
    assert shd.logical_to_spec(("batch", None), (4, 5), mesh) == P(("data", "fsdp"), None)
    assert shd.logical_to_spec((), (), mesh) == P()


def test_logical_to_spec_prefix_rule_and_axis_reuse():
    mesh = shd.make_mesh(data=2, fsdp=4, tensor=1)
    # 6 rows: data (2) divides, data×fsdp (8) does not -> keep the prefix ("data",).
    assert shd.logical_to_spec(("batch",), (6,), mesh) == P("data")
    # Each mesh axis at most once per array: the second "embed" dim loses fsdp.
    assert shd.logical_to_spec(("embed", "embed"), (8, 8), mesh) == P("fsdp", None)


def test_logical_to_spec_errors_name_the_problem():
    mesh = shd.make_mesh(fsdp=2, tensor=4)
    with pytest.raises(KeyError, match="'experts' has no rule"):
        shd.logical_to_spec(("experts",), (8,), mesh)
    with pytest.raises(ValueError, match="do not match shape"):
        shd.logical_to_spec(("embed",), (8, 8), mesh)
    with pytest.raises(KeyError, match="names mesh axis 'pipeline'"):
        shd.logical_to_spec(("embed",), (8,), mesh, rules=(("embed", "pipeline"),))


def test_qwen_param_shardings_divide_every_dimension():
    """Real Qwen2.5-0.5B shapes (14 heads, 2 KV heads) on fsdp=2 × tensor=4: all specs valid."""
    config = models.get_preset("qwen2.5-0.5b")
    mesh = shd.make_mesh(fsdp=2, tensor=4)
    shapes = models.param_shapes(config)
    shardings = shd.logical_to_sharding(models.param_logical_axes(config), mesh, shd.DEFAULT_RULES,
                                        shapes)
    flat_sh = jax.tree.leaves(shardings)
    flat_shapes = jax.tree.leaves(shapes)
    assert len(flat_sh) == len(flat_shapes)
    for sharding, leaf in zip(flat_sh, flat_shapes):
        for dim, axes in zip(leaf.shape, sharding.spec):
            names = () if axes is None else (axes,) if isinstance(axes, str) else axes
            assert dim % int(np.prod([mesh.shape[a] for a in names])) == 0
    layer = shardings["layers_0"]
    assert layer["mlp"]["up_proj"]["kernel"].spec == P("fsdp", "tensor")
    assert layer["mlp"]["down_proj"]["kernel"].spec == P("tensor", "fsdp")
    assert layer["self_attn"]["q_proj"]["kernel"].spec == P("fsdp", None, None)  # 14 % 4 != 0
    assert layer["self_attn"]["k_proj"]["kernel"].spec == P("fsdp", None, None)  # 2 % 4 != 0
    assert shardings["embed_tokens"]["embedding"].spec == P("tensor", "fsdp")


def test_sharded_arrays_place_and_optimizer_state_follows_params():
    mesh = shd.make_mesh(fsdp=2, tensor=4)
    params = {"w": {"kernel": jnp.arange(32.0).reshape(8, 4)}, "n": {"scale": jnp.ones(4)}}
    axes = {"w": {"kernel": ("embed", "mlp")}, "n": {"scale": ("norm",)}}
    shardings = shd.logical_to_sharding(axes, mesh, shapes=params)
    placed = jax.device_put(params, shardings)
    assert placed["w"]["kernel"].sharding.spec == P("fsdp", "tensor")
    # Each of the 8 devices holds a distinct [4, 1] block.
    assert {s.data.shape for s in placed["w"]["kernel"].addressable_shards} == {(4, 1)}
    opt = make_optimizer(make_schedule(1e-3))
    opt_sh = opt_state_shardings(opt, params, shardings, shd.replicated(mesh))
    adam = opt_sh[1][0]
    assert adam.mu["w"]["kernel"].spec == P("fsdp", "tensor")
    assert adam.nu["n"]["scale"].spec == P(None)
    assert adam.count.spec == P()
    state = jax.jit(opt.init, out_shardings=opt_sh)(placed)
    assert state[1][0].mu["w"]["kernel"].sharding.spec == P("fsdp", "tensor")


def test_batch_sharding_and_divisor():
    mesh = shd.make_mesh(data=2, fsdp=2, tensor=2)
    assert shd.batch_divisor(mesh) == 4
    x = jax.device_put(np.zeros((8, 3), np.float32), shd.batch_sharding(mesh))
    assert x.sharding.spec == P(("data", "fsdp"))
    # Each batch shard is replicated over the 2 tensor devices: 4 distinct row blocks of 2.
    assert {s.data.shape for s in x.addressable_shards} == {(2, 3)}
    y = jax.jit(lambda a: shd.with_batch_constraint(a, mesh, batch_dim=1))(np.zeros((3, 8)))
    assert y.sharding.spec == P(None, ("data", "fsdp"))
