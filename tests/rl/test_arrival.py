"""The arrival model (rl.arrival): inclusion probability per Δt from started vs trained counts."""

import json

import numpy as np
import pytest

from rl4mle_jax.rl.arrival import ArrivalModel


def _durations(rng, n):
    """Half fast (≈1 s), half slow (≈10 s), 10% lognormal jitter."""
    return np.where(rng.random(n) < 0.5, 1.0, 10.0) * np.exp(0.1 * rng.standard_normal(n))


def test_nothing_lost_gives_one_even_with_episodes_in_flight():
    """Everything finished is trained; slow episodes still running at `now` are not losses."""
    rng = np.random.default_rng(0)
    model = ArrivalModel()
    t0, dt = rng.uniform(0, 100, 3000), _durations(rng, 3000)
    for i in np.argsort(t0):
        model.started(int(i), t0[i])
    for i in np.nonzero(t0 + dt < 100)[0]:
        model.finished(int(i), dt[i], trained=True)
    model.cancelled(int(np.nonzero(t0 + dt >= 100)[0][0]), 0.5, at_shutdown=True)
    assert model.in_flight > 100
    assert all(r["inclusion"] == 1.0 for r in model.table(now=100.0))
    np.testing.assert_array_equal(model.inclusion([1.0, 10.0, 5000.0], now=100.0), 1.0)


def test_drops_at_finish_and_cancellation_censoring():
    """Slow finishers dropped half the time; a cancel clock C ~ Exp(mean 5 s), independent of Δt:
    p(Δt) = exp(−Δt/5) · q(Δt). The cancelled episodes' Δt is never seen (censored at C)."""
    rng = np.random.default_rng(1)
    model = ArrivalModel()
    n = 40000
    dt, cancel_at = _durations(rng, n), rng.exponential(5.0, n)
    for i in range(n):
        model.started(i, 0.0)
        if cancel_at[i] < dt[i]:
            model.cancelled(i, cancel_at[i])
        else:
            model.finished(i, dt[i], trained=not (dt[i] > 5 and rng.random() < 0.5))
    p_fast, p_slow = model.inclusion([1.0, 10.0])
    np.testing.assert_allclose(p_fast, np.exp(-1 / 5), atol=0.01)
    np.testing.assert_allclose(p_slow, 0.5 * np.exp(-10 / 5), rtol=0.08)
    # A naive estimate (cancelled counted in the bucket of their elapsed time) puts most losses
    # on the fast buckets; the table's started (finished / S_C) recovers the true split.
    rows = [r for r in model.table() if r["trained"] + r["dropped"] > 0]
    started = sum(r["started"] for r in rows if r["hi_s"] > 5)
    np.testing.assert_allclose(started, n / 2, rtol=0.05)
    assert sum(r["trained"] + r["dropped"] + r["cancelled"] + r["censored"]
               for r in model.table()) == n


def test_sparse_buckets_pool_towards_the_overall_rate():
    model = ArrivalModel(prior_strength=2.0)
    for i in range(20):
        model.started(i, 0.0)
        model.finished(i, 1.0, trained=i % 2 == 0)
    model.started(99, 0.0)
    model.finished(99, 100.0, trained=False)  # one slow drop
    q_bar = 10 / 21  # trained / finished over the run
    p = model.inclusion([1.0, 100.0, 1e4])  # q_b = (trained_b + 2 q̄) / (finished_b + 2)
    np.testing.assert_allclose(p, [(10 + 2 * q_bar) / 22, 2 * q_bar / 3, q_bar], rtol=1e-6)
    # The table's p̂ is the same estimate, at each bucket's mean finisher Δt (at_s).
    rows = {r["at_s"]: r for r in model.table() if r["trained"] + r["dropped"]}
    assert sorted(rows) == [1.0, 100.0]
    np.testing.assert_allclose([rows[1.0]["inclusion"], rows[100.0]["inclusion"]], p[:2])
    np.testing.assert_allclose([rows[1.0]["rate"], rows[100.0]["rate"]], [10 / 20, 0.0])


def test_state_dict_round_trip_and_errors():
    model = ArrivalModel(edges_s=[1.0, 4.0, 16.0])
    for i in range(4):
        model.started(i, float(i))
    model.finished(0, 2.0, trained=False)
    model.cancelled(1, 3.0)
    state = json.loads(json.dumps(model.state_dict()))
    again = ArrivalModel.from_state_dict(state)
    assert json.dumps(again.table(now=10.0)) == json.dumps(model.table(now=10.0))
    assert again.in_flight == 2
    again.finished(2, 5.0)  # in-flight episodes survive the checkpoint
    with pytest.raises(KeyError, match="episode 7 was not started"):
        model.finished(7, 1.0)
    with pytest.raises(ValueError, match="episode 2 started twice"):
        model.started(2, 0.0)
    with pytest.raises(ValueError, match="dt_s of episode 2 must be finite and >= 0"):
        model.finished(2, -1.0)
    with pytest.raises(ValueError, match="strictly increasing"):
        ArrivalModel(edges_s=[1.0, 1.0])
    with pytest.raises(ValueError, match="dt_b must be finite and >= 0"):
        model.inclusion([np.nan])
    with pytest.raises(ValueError, match="'trained' has"):
        ArrivalModel.from_state_dict({**state, "trained": [0, 1]})


def test_stop_in_flight_censors_what_a_resumed_run_never_sees_finish():
    m = ArrivalModel()
    for i in range(4):
        m.started(i, 10.0 * i)
    m.finished(0, 2.0)
    m.stop_in_flight()  # the checkpoint was written while 1, 2, 3 ran
    assert m.in_flight == 0
    assert sum(m.censored) == 3 and sum(m.cancelled_lost) == 0 and sum(m.dropped) == 0
    np.testing.assert_allclose(m.inclusion([1.0, 30.0]), 1.0)  # nothing was lost
    m.started(1, 50.0)  # the resumed run may reuse the id
