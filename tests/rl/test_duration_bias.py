"""The duration-bias toy (experiments/duration_bias.py) in its default setting, fewer seeds.

What the issue expected: vanilla ends on fast_valid, DAG on slow_valid. What this setting shows
(see the experiment's docstring and the report): in a rollout pool where each of K actors draws
every new episode from the current policy, completions arrive in proportion to π (renewal
theorem: an actor completes T/E[Δt] episodes, a fraction π_x of them action x), not to π/Δt, so
vanilla PPO is not biased towards the fast action in steady state and ends on slow_valid too.
Under the paper's premise imposed directly (arrivals="premise"), vanilla detours through the
fast action and DAG shortens the detour; at a long enough budget both end on the slow action.
These tests pin those findings down so that a change in the learner code that alters them shows.
"""

import dataclasses
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parents[2] / "experiments" / "duration_bias.py"


@pytest.fixture(scope="module")
def toy():
    spec = importlib.util.spec_from_file_location("duration_bias", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["duration_bias"] = module  # dataclasses resolve annotations through it
    spec.loader.exec_module(module)
    return module


def test_completions_follow_the_policy_not_one_over_duration(toy):
    """Frozen uniform policy (lr 0): the learner sees each action ≈ 1/3 of the time, not 10:10:1."""
    cfg = toy.ToyConfig(budget_s=1500.0, lr=0.0, critic_lr=0.0)
    result = toy.simulate(cfg, seed=0)
    share = result.action_counts / result.action_counts.sum()
    assert result.action_counts.sum() > 5000
    np.testing.assert_allclose(share, [1 / 3, 1 / 3, 1 / 3], atol=0.02)
    np.testing.assert_allclose(result.probs[-1], 1 / 3, rtol=1e-6)


def test_cancelling_stragglers_does_bias_completions_towards_fast(toy):
    """The variant where each batch is the first B finishers of K fresh actors: n_x ∝ π_x/Δt_x."""
    cfg = toy.ToyConfig(budget_s=600.0, lr=0.0, critic_lr=0.0, num_actors=64,
                        arrivals="cancel")
    result = toy.simulate(cfg, seed=0)
    share = result.action_counts / result.action_counts.sum()
    assert share[2] < 0.05  # slow_valid almost never among the first 32 of 64 to finish


def test_premise_arrivals_follow_policy_over_duration(toy):
    cfg = toy.ToyConfig(budget_s=1500.0, lr=0.0, critic_lr=0.0, arrivals="premise")
    result = toy.simulate(cfg, seed=1)
    share = result.action_counts / result.action_counts.sum()
    np.testing.assert_allclose(share, np.array([10, 10, 1]) / 21, atol=0.02)


def _per_seed(toy, arrivals, seeds, budget_s):
    cfg = dataclasses.replace(toy.ToyConfig(), budget_s=budget_s, arrivals=arrivals)
    results = toy.run_all(cfg, seeds=seeds, modes=["off", "batch_mean"])
    return {mode: [(r.probs[-1], r.probs[:, 1].max(), toy.slow_wins_at(r)) for r in runs]
            for mode, runs in results.items()}


def test_default_pool_both_end_on_slow_and_dag_gets_there_first(toy):
    """Default arrivals: no steady-state count bias, so vanilla ends on slow_valid as well."""
    runs = _per_seed(toy, "pool", seeds=[0, 1, 2], budget_s=900.0)
    for mode in ("off", "batch_mean"):
        ends_slow = sum(int(final.argmax() == 2) for final, _, _ in runs[mode])
        assert ends_slow >= 2, (mode, runs[mode])
    # only the start-up transient (no slow episode can finish in the first ~10 s) favours fast
    earlier = sum(d[2] < v[2] for v, d in zip(runs["off"], runs["batch_mean"]))
    assert earlier >= 2, runs


def test_under_the_premise_vanilla_detours_through_fast_and_dag_does_not(toy):
    """n_x ∝ π_x/Δt_x: vanilla makes fast_valid the most probable action for a while; DAG's
    detour is shallower and slow_valid wins earlier. Both end on slow_valid in this toy (the
    whitened batch-mean baseline favours the better action once failures are gone)."""
    runs = _per_seed(toy, "premise", seeds=[0, 1, 2], budget_s=900.0)
    pairs = list(zip(runs["off"], runs["batch_mean"]))
    assert sum(v[1] > 0.5 for v, _ in pairs) >= 2, pairs  # vanilla: fast_valid above 1/2
    assert sum(v[1] > d[1] + 0.1 for v, d in pairs) >= 2, pairs  # DAG peaks lower
    assert sum(v[2] > d[2] for v, d in pairs) >= 2, pairs  # and DAG's slow wins earlier
    assert sum(int(d[0].argmax() == 2) for _, d in pairs) >= 2, pairs


def test_table_names_every_action(toy):
    cfg = toy.ToyConfig(budget_s=120.0)
    rows = toy.summarise(toy.run_all(cfg, seeds=[0], modes=["off", "batch_mean"]))
    table = toy.format_table(rows)
    assert all(f"P({name})" in table for name in toy.ACTIONS)
    assert [r["mode"] for r in rows] == ["off", "batch_mean"]
    assert "| ends on slow |" in toy.format_markdown(rows)
    with pytest.raises(ValueError, match="arrivals 'queue' is not one of"):
        toy.simulate(toy.ToyConfig(arrivals="queue"), seed=0)


def test_the_toy_uses_the_loops_arrival_model(toy):
    from rl4mle_jax.rl.arrival import ArrivalModel

    assert toy.ArrivalModel is ArrivalModel and "inverse_inclusion" in toy.WEIGHT_MODES


def test_admission_bounds_unsettled_episodes_and_loses_nothing(toy):
    """Nothing is lost under admission control: p̂ = 1, so inverse_inclusion is vanilla."""
    cfg = toy.ToyConfig(budget_s=300.0, arrivals="admission", max_staleness=0, num_actors=64)
    off = toy.simulate(cfg, seed=0)
    inv = toy.simulate(dataclasses.replace(cfg, dag_mode="inverse_inclusion"), seed=0)
    assert off.max_unsettled == cfg.batch_size and off.dropped == 0
    np.testing.assert_array_equal(off.final_inclusion, 1.0)
    np.testing.assert_array_equal(inv.probs, off.probs)


def test_drop_stale_loses_slow_episodes_and_inverse_inclusion_corrects_it(toy):
    """The loop's old rule (drop finishers > 1 version old): vanilla collapses onto fast_valid;
    weighting by 1/p̂ of the run's own arrival model ends on slow_valid."""
    cfg = toy.ToyConfig(budget_s=900.0, arrivals="drop_stale", max_staleness=1)
    runs = toy.run_all(cfg, seeds=[0, 1, 2], modes=["off", "inverse_inclusion"])
    for off, inv in zip(runs["off"], runs["inverse_inclusion"]):
        assert off.dropped > 0 and off.final_inclusion[2] < 0.5 < off.final_inclusion[1]
        assert off.probs[-1].argmax() == 1 and inv.probs[-1].argmax() == 2, (off.probs[-1],
                                                                             inv.probs[-1])
