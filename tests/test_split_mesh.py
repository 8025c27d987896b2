"""Split devices (mesh.sampler_devices): the sampler and the learner on disjoint meshes of the 8
CPU devices. Sampling continues while a train step runs, each Generation carries the version of
the weights that produced it, training equals the one-mesh path on the same batches, and a
checkpoint resumes onto either layout."""

import asyncio
import sys
import types
from pathlib import Path

import jax
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from configs import task as task_config  # noqa: E402
from rl4mle_jax import models  # noqa: E402
from rl4mle_jax import sharding as shd  # noqa: E402
from rl4mle_jax.components import validate_config  # noqa: E402
from rl4mle_jax.rollout.episode import Experience  # noqa: E402
from rl4mle_jax.rollout.publish import WeightPublisher  # noqa: E402
from rl4mle_jax.sampling import Sampler  # noqa: E402
from rl4mle_jax.train import _Trainer  # noqa: E402

TINY = models.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=8)
STOP = 1
# A tiny loop: responses of up to 48 tokens, batches of 8, an lr large enough that the policy's
# log-probs move visibly from one version to the next. adam_eps 1e-6: see tests/rl/test_learner.
BASE = {"prompt.max_prompt_tokens": 16, "prompt.max_response_tokens": 48,
        "instrument.max_new_tokens": 48, "run.batch_size": 8, "learner.actor_lr": 1e-2,
        "learner.critic_lr": 1e-2, "learner.adam_eps": 1e-6, "sampling.max_batch": 4,
        "sampling.max_wait_s": 0.005}


@pytest.fixture(scope="module")
def params():
    return jax.device_get(jax.jit(models.init_params, static_argnums=0)(TINY,
                                                                        jax.random.PRNGKey(0)))


def _trainer(workdir, params, **overrides) -> _Trainer:
    cfg = task_config.get_config()
    cfg.update_from_flattened_dict({**BASE, **overrides})
    sampler = Sampler(TINY, [STOP], 0, prompt_buckets=(16,), batch_buckets=(4,),
                      new_token_buckets=(48,))
    comps = types.SimpleNamespace(model_config=TINY, params=params, sampler=sampler,
                                  tokenizer=types.SimpleNamespace(pad_id=0),
                                  task=types.SimpleNamespace(id="toy"), views={})
    return _Trainer(cfg, Path(workdir), comps)


def _close(trainer: _Trainer) -> None:
    trainer.ckpt.close()
    trainer.explog.close()
    trainer.metrics.close()
    trainer.lane.shutdown()
    trainer.sampler_lane.shutdown()


def _batches(n_steps: int, seed: int = 0) -> list[list[Experience]]:
    """Batch k of fixed episodes, half sampled at version k (fresh) and half at k - 1."""
    rng = np.random.default_rng(seed)
    out = []
    for step in range(n_steps):
        batch = []
        for i in range(8):
            r = int(rng.integers(4, 40))
            batch.append(Experience(
                episode_id=step * 8 + i, kind="solve",
                prompt_ids=rng.integers(2, 64, int(rng.integers(3, 16))).tolist(),
                response_ids=rng.integers(2, 64, r).tolist(),
                logprobs=rng.normal(-4.2, 0.2, r).tolist(),
                params_version=max(step - i % 2, 0), reward=float(rng.normal()), record={},
                plan="", code=None, response_stopped=True, started_at=0.0,
                finished_at=float(rng.uniform(1, 5)), duration_s=float(rng.uniform(1, 5)),
                timings={}))
        out.append(batch)
    return out


def _devices(tree) -> set:
    return set().union(*(leaf.sharding.device_set for leaf in jax.tree.leaves(tree)))


def _assert_close(a, b, rtol=1e-4, atol=2e-5):
    for (path, x), (_, y) in zip(jax.tree_util.tree_flatten_with_path(a)[0],
                                 jax.tree_util.tree_flatten_with_path(b)[0]):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol,
                                   err_msg=jax.tree_util.keystr(path))


# ----------------------------------------------------------------------------- meshes, config
def test_meshes_split_the_devices():
    devices = jax.devices()
    one = shd.make_meshes()
    assert one.sampler is None and one.learner.devices.size == 8
    split = shd.make_meshes(sampler_devices=3, fsdp=-1, data=1)
    assert list(split.sampler.devices.flat) == devices[:3]
    assert list(split.learner.devices.flat) == devices[3:]
    assert dict(split.sampler.shape) == {"data": 1, "fsdp": 1, "tensor": 3}
    assert dict(split.learner.shape) == {"data": 1, "fsdp": 5, "tensor": 1}
    with pytest.raises(ValueError, match="at least one of the 8 devices to the learner"):
        shd.make_meshes(sampler_devices=8)


@pytest.mark.parametrize("overrides,message", [
    ({"mesh.sampler_devices": -1}, r"config\.mesh\.sampler_devices: must be >= 0"),
    ({"mesh.sampler_devices": 8}, r"config\.mesh: sampler_devices=8 must leave"),
    # 8 rows split over 8 devices, but not over the learner's 6 (after 2 sample).
    ({"mesh.sampler_devices": 2}, r"config\.run\.batch_size: 8 .* learner mesh's data × fsdp "
                                  r"size 6 \(6 devices, after mesh\.sampler_devices=2\)"),
])
def test_bad_split_names_the_key(overrides, message):
    config = task_config.get_config()
    config.update_from_flattened_dict(overrides)
    with pytest.raises(ValueError, match=message):
        validate_config(config)
    config.update_from_flattened_dict({"mesh.sampler_devices": 4})
    validate_config(config)  # 8 rows over the learner's 4 devices


def test_publisher_versions_and_placement(params):
    split = shd.make_meshes(sampler_devices=4)
    from rl4mle_jax.rollout.publish import param_shardings

    pub = WeightPublisher(param_shardings(TINY, split.sampler))
    with pytest.raises(RuntimeError, match="no weights published"):
        pub.latest()
    pub.publish(params, 3)
    placed, version = pub.latest()
    assert version == 3 and _devices(placed) == set(jax.devices()[:4])
    _assert_close(placed, params, rtol=0, atol=0)
    with pytest.raises(ValueError, match="version 2 published after 3"):
        pub.publish(params, 2)
    same = WeightPublisher()  # one mesh: the learner's own arrays, no copy
    same.publish(params, 0)
    assert same.latest()[0] is params


# ----------------------------------------------------------------------------- sampling
@jax.jit
def _forward_logprobs(params, tokens, temperature):
    return jax.nn.log_softmax(models.logits(TINY, params, tokens) / temperature, axis=-1)


def _logprobs(params, gen, temperature):
    """The response's log-probs under `params` at `temperature`, from a full forward (right
    padded to one length: causal, so the padding changes nothing before it)."""
    seq = gen.prompt_ids + gen.response_ids
    tokens = np.zeros((1, 64), np.int32)
    tokens[0, :len(seq)] = seq
    logp = np.asarray(_forward_logprobs(params, tokens, np.float32(temperature)))[0]
    p = len(gen.prompt_ids)
    return np.asarray([logp[p - 1 + j, t] for j, t in enumerate(gen.response_ids)])


def _run_while_learning(trainer: _Trainer, batches):
    """8 clients keep the services saturated while the learner trains on `batches`; returns
    (the train steps' metrics, policy generations in completion order, frozen generations,
    host params per version). A last request, after the clients stop, gets the last version."""
    snapshots = {trainer.loop.version: jax.device_get(trainer.state.policy_params)}

    async def main():
        policy, frozen = trainer._services()
        policy.start()
        frozen.start()
        gens = {"policy": [], "frozen": []}
        stop = asyncio.Event()

        async def client(i):
            rng = np.random.default_rng(i)
            name = "frozen" if i % 4 == 3 else "policy"
            while not stop.is_set():
                prompt = rng.integers(2, 64, int(rng.integers(3, 16))).tolist()
                gens[name].append(await (frozen if name == "frozen" else policy).generate(prompt))

        clients = [asyncio.create_task(client(i)) for i in range(8)]
        loop = asyncio.get_running_loop()
        metrics = []
        while not gens["policy"]:  # the sampler is compiled before the learner starts
            await asyncio.sleep(0.05)
        for batch in batches:
            metrics.append(await loop.run_in_executor(trainer.lane, trainer._learn, batch))
            snapshots[trainer.loop.version] = jax.device_get(trainer.state.policy_params)
        stop.set()
        await asyncio.gather(*clients)
        gens["policy"].append(await policy.generate([5, 6, 7]))
        await policy.stop()
        await frozen.stop()
        return metrics, gens

    metrics, gens = asyncio.run(main())
    return metrics, gens["policy"], gens["frozen"], snapshots


@pytest.mark.parametrize("split", [True, False], ids=["split", "one_lane"])
def test_sampling_continues_while_a_train_step_runs(tmp_path, params, split):
    trainer = _trainer(tmp_path, params, **{"mesh.sampler_devices": 4 if split else 0})
    try:
        metrics, policy_gens, frozen_gens, snapshots = _run_while_learning(trainer, _batches(3))
    finally:
        _close(trainer)
    idle = [m["sampler/idle_frac_during_learn"] for m in metrics]
    if split:
        # The first step compiles the train step; after that the sampler, saturated by the
        # clients, stays busy through the learner's steps (wide margin for a loaded machine).
        assert np.mean(idle[1:]) < 0.5, idle
        assert _devices(trainer.publisher.latest()[0]) == set(jax.devices()[:4])
        assert _devices(trainer.frozen) == set(jax.devices()[:4])
        assert _devices(trainer.state.policy_params) == set(jax.devices()[4:])
        assert trainer.reference is None  # no KL reference: no frozen copy on the learner
    else:
        assert min(idle) > 0.999, idle  # one lane: the sampler waits for every train step
    assert trainer.publisher.latest()[1] == trainer.loop.version == 3
    versions = [g.params_version for g in policy_gens]
    assert versions == sorted(versions) and versions[-1] == 3  # switched between requests
    assert len(set(versions)) >= 2, versions
    # Each generation's tokens came from the weights of the version it records: the
    # behaviour log-probs match that version's and no other's (the frozen copy's: version 0's
    # params, at the instrumenter's temperature).
    temperature = trainer.config.sampling.temperature
    for gen in frozen_gens[:4]:
        assert gen.params_version == -1
        gap = np.abs(_logprobs(snapshots[0], gen, trainer.config.instrument.temperature)
                     - np.asarray(gen.logprobs))
        assert not gen.response_ids or gap.max() < 1e-3, gap
    checked = 0
    for gen in policy_gens[::max(len(policy_gens) // 12, 1)] + policy_gens[-1:]:
        if not gen.response_ids:
            continue
        gaps = {v: np.abs(_logprobs(p, gen, temperature) - np.asarray(gen.logprobs)).max()
                for v, p in snapshots.items()}
        assert gaps[gen.params_version] < 1e-3, gaps
        assert min(gaps, key=gaps.get) == gen.params_version, gaps
        checked += 1
    assert checked >= 3


# ----------------------------------------------------------------------------- training
@pytest.mark.parametrize("learner", [{}, {"learner.kl_mode": "loss", "learner.kl_coef": 0.1}],
                         ids=["default", "kl_reference"])
def test_training_equals_the_one_mesh_path(tmp_path, params, learner):
    one = _trainer(tmp_path / "one", params, **learner)
    split = _trainer(tmp_path / "split", params, **{"mesh.sampler_devices": 4, **learner})
    try:
        assert (one.reference is None) == (split.reference is None) == (not learner)
        for batch in _batches(3, seed=1):
            m_one, m_split = one._learn(batch), split._learn(batch)
            for k in m_one:
                if not k.startswith(("time/", "sampler/")):
                    np.testing.assert_allclose(m_split[k], m_one[k], rtol=1e-4, atol=2e-5,
                                               err_msg=k)
        _assert_close(jax.device_get(split.state), jax.device_get(one.state))
        published, version = split.publisher.latest()
        assert version == split.loop.version == 3
        _assert_close(published, split.state.policy_params, rtol=0, atol=0)
        if learner:
            assert _devices(split.reference) == set(jax.devices()[4:])
    finally:
        _close(one)
        _close(split)


def test_checkpoint_resumes_onto_the_split_mesh(tmp_path, params):
    one = _trainer(tmp_path, params)
    try:
        one._learn(_batches(1)[0])
        one._save(force=True)
        saved = jax.device_get(one.state)
    finally:
        _close(one)
    split = _trainer(tmp_path, params, **{"mesh.sampler_devices": 4})
    try:
        assert split.loop.step == split.loop.version == 1
        _assert_close(jax.device_get(split.state), saved, rtol=0, atol=0)
        assert _devices(split.state) == set(jax.devices()[4:])
        published, version = split.publisher.latest()
        assert version == 1 and _devices(published) == set(jax.devices()[:4])
        _assert_close(published, saved.policy_params, rtol=0, atol=0)
    finally:
        _close(split)
