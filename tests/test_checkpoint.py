"""Orbax checkpoints of the whole train state: exact round trip, other mesh shapes, retention."""

import jax
import numpy as np
import pytest

from rl4mle_jax import models
from rl4mle_jax import sharding as shd
from rl4mle_jax.checkpoint import CheckpointManager, abstract_like
from rl4mle_jax.rl.learner import make_learner
from rl4mle_jax.rl.learner_config import LearnerConfig

TINY = models.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=8)
CFG = LearnerConfig(actor_lr=1e-3, critic_lr=1e-3, micro_batch_size=0)


def _batch(b=8, t=10, seed=0):
    rng = np.random.default_rng(seed)
    response = np.zeros((b, t), np.int32)
    response[:, 4:] = 1
    return dict(tokens=rng.integers(0, 64, (b, t)).astype(np.int32),
                attention_mask=np.ones((b, t), np.int32), response_mask=response,
                old_logprobs=rng.normal(-4.0, 0.1, (b, t)).astype(np.float32),
                values_old=rng.normal(0, 0.1, (b, t)).astype(np.float32),
                rewards=rng.normal(size=b).astype(np.float32),
                dt_s=rng.uniform(1, 5, b).astype(np.float32))


def _assert_trees_equal(a, b):
    leaves_a, tree_a = jax.tree.flatten(a)
    leaves_b, tree_b = jax.tree.flatten(b)
    assert tree_a == tree_b
    for x, y in zip(leaves_a, leaves_b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _perturb(learner, state):
    """Every leaf of the state made distinct and non-trivial (as after training), same layout."""
    rng = np.random.default_rng(2)
    host = jax.device_get(state)
    host = jax.tree.map(lambda x: x + rng.normal(size=x.shape).astype(x.dtype)
                        if np.issubdtype(x.dtype, np.floating) else x + 3, host)
    return jax.device_put(host, learner.state_shardings)


@pytest.fixture(scope="module")
def trained():
    """A state with non-trivial values on fsdp=2 × tensor=4, and its learner."""
    learner = make_learner(TINY, CFG, shd.make_mesh(fsdp=2, tensor=4))
    params = models.init_params(TINY, jax.random.PRNGKey(0))
    state = learner.init_state(learner.shard_params(params), jax.random.PRNGKey(1))
    return learner, _perturb(learner, state)


def test_round_trip_exact_with_metadata(trained, tmp_path):
    learner, state = trained
    with CheckpointManager(tmp_path / "ckpt", max_to_keep=2) as mngr:
        assert mngr.save(1, state, {"config": CFG, "model": TINY}, policy_version=7)
        mngr.wait_until_finished()
        restored, meta = mngr.restore(learner.abstract_state())
    _assert_trees_equal(restored, state)
    assert restored.policy_params["layers_0"]["mlp"]["up_proj"]["kernel"].sharding == \
        state.policy_params["layers_0"]["mlp"]["up_proj"]["kernel"].sharding
    assert meta["step"] == 1 and meta["policy_version"] == 7
    assert meta["config"]["actor_lr"] == CFG.actor_lr
    assert LearnerConfig.from_dict(meta["config"]) == CFG
    assert meta["model"]["vocab_size"] == 64


@pytest.mark.parametrize("mesh_kwargs", [dict(data=8), dict(devices=jax.devices()[:1])])
def test_restore_onto_another_mesh(trained, tmp_path, mesh_kwargs):
    """Saved on fsdp×tensor = 2×4, restored on another mesh: same values, the new layout.
    (That train_step gives the same update on every mesh is tested in tests/rl/test_learner.py.)"""
    learner, state = trained
    with CheckpointManager(tmp_path / "ckpt") as mngr:
        mngr.save(1, state, {"policy_version": 1})
        other = make_learner(TINY, CFG, shd.make_mesh(**mesh_kwargs))
        restored, _ = mngr.restore(other.abstract_state())
    _assert_trees_equal(restored, state)
    for x, y in zip(jax.tree.leaves(restored), jax.tree.leaves(other.state_shardings)):
        assert x.sharding == y


def test_keeps_last_n_and_restores_a_chosen_step(tmp_path):
    tree = {"w": np.arange(6.0, dtype=np.float32).reshape(2, 3), "step": np.int32(0)}
    with CheckpointManager(tmp_path / "ckpt", max_to_keep=2) as mngr:
        for step in (1, 2, 3):
            mngr.save(step, {"w": tree["w"] * step, "step": np.int32(step)}, {"v": step})
        mngr.wait_until_finished()
        assert mngr.all_steps() == [2, 3]
        assert mngr.latest_step() == 3
        abstract = abstract_like(jax.tree.map(jax.numpy.asarray, tree))
        restored, meta = mngr.restore(abstract, step=2)
        np.testing.assert_array_equal(np.asarray(restored["w"]), tree["w"] * 2)
        assert meta == {"step": 2, "v": 2}
        assert mngr.restore_metadata()["v"] == 3
        with pytest.raises(FileNotFoundError, match=r"step 1 .*available: \[2, 3\]"):
            mngr.restore(abstract, step=1)


def test_empty_directory_and_bad_arguments(tmp_path):
    with CheckpointManager(tmp_path / "empty") as mngr:
        with pytest.raises(FileNotFoundError, match="no checkpoint in"):
            mngr.restore({"w": jax.ShapeDtypeStruct((2,), np.float32)})
    with pytest.raises(ValueError, match="max_to_keep must be >= 1"):
        CheckpointManager(tmp_path / "x", max_to_keep=0)


def test_async_save_is_safe_against_donating_the_state_right_after(trained, tmp_path):
    """save() returns before the write finishes; the train loop then donates the state to the
    next train_step. The checkpoint must still hold the values at save time."""
    learner, state = trained
    state = jax.tree.map(lambda x: x.copy(), state)
    expected = jax.device_get(state)
    bump = jax.jit(lambda s: jax.tree.map(lambda x: x * 2, s), donate_argnums=0,
                   out_shardings=learner.state_shardings)
    with CheckpointManager(tmp_path / "ckpt", async_save=True) as mngr:
        mngr.save(5, state)
        bumped = bump(state)  # reuses (donates) the buffers being saved
        jax.block_until_ready(bumped)
        restored, meta = mngr.restore(learner.abstract_state())
    _assert_trees_equal(restored, expected)
    assert meta["step"] == 5
