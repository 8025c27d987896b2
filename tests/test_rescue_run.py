"""SFT rescue on a deliberately broken warm start: the rescue update raises its valid rate, and
the loop rescues by itself (rescues.jsonl, the metric, the checkpointed monitor)."""

import asyncio
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.warm import warm_config

NOISE = 1.0  # Gaussian noise of this many standard deviations on every weight: 0/8 valid


def _broken(params):
    leaves, tree = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(0), len(leaves))
    return jax.tree_util.tree_unflatten(tree, [
        x + NOISE * jnp.std(x) * jax.random.normal(k, x.shape, x.dtype)
        for x, k in zip(leaves, keys)])


@pytest.fixture(scope="module")
def comps(warm_cache, tmp_path_factory):
    from rl4mle_jax.components import build_components

    c = build_components(warm_config(warm_cache), tmp_path_factory.mktemp("unused"))
    yield c
    c.sandbox.close()


def _valid_rate(comps, params, n=32):
    """Valid share of n solve samples at T 0.7. n = 32: with 8 the rescued policy's rate read
    0.125 in one test session where CI's had passed, and 0.25 on the same machine from a warm
    start built outside pytest (0.44 at n = 32 there): the warm start, and so the rescued
    policy, differ with the machine and with the session's 8 XLA host devices (conftest)."""
    from rl4mle_jax.best_of_n import _run_candidates, _sample_codes, solve_prompt_text

    cands = _sample_codes(comps, params, [solve_prompt_text(comps)] * n, jax.random.PRNGKey(5),
                          "solve", 0.7, comps.prompt_cfg.max_response_tokens)
    asyncio.run(_run_candidates(cands, comps.task, comps.sandbox, 60, 2))
    return float(np.mean([c.score("reward") is not None for c in cands]))


def test_rescue_update_repairs_a_broken_policy(comps):
    from rl4mle_jax import sharding
    from rl4mle_jax.best_of_n import solve_prompt_text
    from rl4mle_jax.rl.learner import make_learner
    from rl4mle_jax.rl.rescue import best_reference, load_references, sft_batch, sft_update
    from rl4mle_jax.run_config import RescueConfig
    from rl4mle_jax.warmstart.demo_runs import render_response

    cfg = warm_config("unused")
    learner = make_learner(comps.model_config, dict(cfg.learner), sharding.make_mesh(data=1))
    state = learner.init_state(learner.shard_params(_broken(comps.params)),
                               jax.random.PRNGKey(1))
    before = _valid_rate(comps, state.policy_params)
    ref = best_reference(load_references(comps), None)
    assert ref is not None and ref["origin"].startswith("demonstration")
    batch = sft_batch(comps.tokenizer, solve_prompt_text(comps),
                      [render_response(ref["plan"], ref["code"])],
                      comps.prompt_cfg.max_prompt_tokens, comps.prompt_cfg.max_response_tokens)
    rc = RescueConfig()  # the defaults the loop uses
    state, losses = sft_update(learner, state, batch, rc.sft_lr, rc.sft_steps,
                               rc.sft_target_loss, rc.sft_min_steps)
    assert rc.sft_min_steps <= len(losses) <= rc.sft_steps
    assert losses[-1] <= rc.sft_target_loss or len(losses) == rc.sft_steps
    after = _valid_rate(comps, state.policy_params)
    assert before == 0.0 and losses[-1] < 0.2 * losses[0]
    assert after >= before + 0.25, (before, after)


def test_the_loop_rescues_a_broken_warm_start(warm_cache, tmp_path, monkeypatch):
    from rl4mle_jax import components
    from rl4mle_jax import train as train_lib

    real = components.build_components

    def broken_components(config, workdir):
        c = real(config, workdir)
        c.params = _broken(c.params)
        return c

    monkeypatch.setattr(train_lib, "build_components", broken_components)
    cfg = warm_config(warm_cache)
    cfg.update_from_flattened_dict({
        "rescue.enabled": True, "rescue.window_steps": 1, "rescue.patience_steps": 3,
        "run.max_steps": 3, "run.batch_size": 4, "run.slots": 2, "run.time_budget_s": 0.0,
        "run.progress": False, "run.eval_samples": 0, "run.checkpoint_every": 1,
        "instrument.max_new_tokens": 256})
    train_lib.train(cfg, tmp_path / "run")
    events = [json.loads(x) for x in (tmp_path / "run" / "rescues.jsonl").read_text()
              .splitlines()]
    first = events[0]
    assert first["event"] == "rescue" and first["step"] == 1  # the first batch is all -10
    assert first["reason"] == "no_separation" and first["valid_rate_before"] == 0.0
    assert first["reference"]["origin"].startswith("demonstration")
    assert first["sft_loss_last"] < first["sft_loss_first"]
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text()
               .splitlines()]
    assert metrics[0]["rescue/count"] == 1.0
