"""The SFT-rescue monitor's rules, against hand-computed windows."""

import numpy as np

from rl4mle_jax.rl.rescue import RescueMonitor, best_reference

REF = {"origin": "demonstration (logistic)", "reward": 0.87, "score": 0.87, "plan": "p",
       "code": "c"}


def _feed(mon, batches):
    for r in batches:
        r = np.asarray(r, float)
        mon.observe(r, r > -1)


def test_no_separation_needs_a_full_window_of_equal_batches():
    mon = RescueMonitor(window_steps=3, margin=0.05, patience_steps=4, max_rescues=2)
    _feed(mon, [[-10, -10], [-10, -10]])
    assert mon.reason(None) is None  # only two batches
    _feed(mon, [[-10, -10]])
    assert mon.reason(None) == "no_separation"
    _feed(mon, [[-10, 0.8]])  # one batch with spread: the last three are no longer all flat
    assert mon.reason(None) is None


def test_reference_gap_against_every_recent_batch_best():
    mon = RescueMonitor(window_steps=2, margin=0.05)
    _feed(mon, [[-10, 0.80], [-10, 0.81]])
    assert mon.reason(0.87) == "reference_gap"  # 0.81 + 0.05 <= 0.87
    assert mon.reason(0.85) is None  # within the margin of the recent best
    assert mon.reason(None) is None


def test_window_refills_max_rescues_outcome_and_give_up():
    mon = RescueMonitor(window_steps=2, margin=0.0, patience_steps=3, max_rescues=1)
    _feed(mon, [[-10, -10], [-10, -10]])
    rec = mon.record(mon.reason(REF["reward"]), REF, [2.0, 0.1])
    assert rec["reason"] == "no_separation" and rec["valid_rate_before"] == 0.0
    assert rec["reference"]["origin"] == REF["origin"] and rec["sft_loss_last"] == 0.1
    _feed(mon, [[-10, -10]])
    assert mon.reason(REF["reward"]) is None  # max_rescues reached (and window not refilled)
    assert mon.outcome() is None and mon.give_up() is None
    _feed(mon, [[-10, -10]])
    out = mon.outcome()
    assert out["valid_rate_after"] == 0.0 and out["separated_after"] is False
    assert mon.outcome() is None  # reported once
    _feed(mon, [[-10, -10]])
    assert "no reward separation within 3 learner steps" in mon.give_up()
    again = RescueMonitor.from_state_dict(mon.state_dict())
    assert again.give_up() == mon.give_up() and again.rescues == mon.rescues


def test_a_rescue_that_separates_is_not_given_up():
    mon = RescueMonitor(window_steps=1, patience_steps=2)
    _feed(mon, [[-10, -10]])
    mon.record("no_separation", REF, [1.0])
    _feed(mon, [[-10, 0.8], [-10, -10]])
    assert mon.outcome()["valid_rate_after"] == 0.5
    assert mon.give_up() is None


def test_best_reference_takes_the_best_that_fits():
    buffer_best = {"code": "x" * 10, "reward": 0.9, "episode_id": 7, "record": {"score": 0.9}}
    fixed = [REF, {**REF, "origin": "long", "reward": 0.95, "code": "y" * 1000}]
    assert best_reference(fixed, buffer_best)["origin"] == "long"
    fits = lambda r: len(r["code"]) < 100  # noqa: E731
    assert best_reference(fixed, buffer_best, fits)["origin"].startswith("best solution")
    assert best_reference([], None) is None


def test_rows_sampled_before_a_rescue_do_not_judge_it():
    mon = RescueMonitor(window_steps=1, patience_steps=2)
    assert mon.observe([-10, -10], [False, False], versions=[3, 3])
    rec = mon.record("no_separation", REF, [1.0, 0.04], version=5)
    assert rec["version"] == 5 and rec["sft_steps"] == 2
    # Still in flight during the rescue (versions 3, 4): not counted at all.
    assert not mon.observe([-10, -10], [False, False], versions=[3, 4])
    assert mon.outcome() is None and len(mon.bests) == 1
    # A mixed batch counts only its rows from the rescued policy on.
    assert mon.observe([-10, 0.8, -10], [False, True, False], versions=[4, 5, 6])
    out = mon.outcome()
    assert out["valid_rate_after"] == 0.5 and out["separated_after"] is True
    assert mon.observe([-10], [False])  # without versions every row counts, as before


def test_sft_update_stops_at_the_target_loss(monkeypatch):
    """At least min_steps, then until the loss reaches the target, at most steps."""
    import types

    import jax.numpy as jnp

    from rl4mle_jax.rl import rescue
    from rl4mle_jax.warmstart import sft

    curve = iter([2.0, 1.0, 0.5, 0.04, 0.03, 0.02, 0.01])

    def fake_step(config, opt):
        return lambda params, opt_state, batch: (params, opt_state, next(curve))

    monkeypatch.setattr(sft, "make_sft_step", fake_step)
    from rl4mle_jax import sharding
    learner = types.SimpleNamespace(model_config=None, mesh=sharding.make_mesh(data=1))
    state = types.SimpleNamespace(policy_params={"w": jnp.zeros(2)},
                                  replace=lambda **kw: types.SimpleNamespace(**kw))
    batch = {"tokens": np.zeros((1, 4), np.int32)}
    _, losses = rescue.sft_update(learner, state, batch, 1e-3, steps=6, target_loss=0.05,
                                  min_steps=2)
    assert losses == [2.0, 1.0, 0.5, 0.04]  # stopped at the first loss <= 0.05
    curve = iter([2.0, 0.01, 0.01, 0.01])
    _, losses = rescue.sft_update(learner, state, batch, 1e-3, steps=6, target_loss=0.05,
                                  min_steps=3)
    assert losses == [2.0, 0.01, 0.01]  # but never fewer than min_steps
