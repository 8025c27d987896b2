"""The multi-task draw (rollout/task_mix.py): its probabilities against a loop-style NumPy
reference, the seeded draw and its resume, drops, and group ids that never mix tasks."""

import numpy as np
import pytest

from rl4mle_jax.rollout.task_mix import TaskMix, sampling_probs, separation, task_group_ids


def _reference_probs(seps, live, mode, floor):
    """The docstring's formula, one task at a time."""
    n = sum(live)
    s = [(1.0 if x is None else x) if alive else 0.0 for x, alive in zip(seps, live)]
    total = sum(s)
    out = []
    for alive, si in zip(live, s):
        if not alive:
            out.append(0.0)
        elif mode == "uniform":
            out.append(1.0 / n)
        else:
            share = si / total if total > 0 else 1.0 / n
            out.append(floor / n + (1.0 - floor) * share)
    return np.asarray(out)


def test_sampling_probs_match_the_reference():
    rng = np.random.default_rng(0)
    for _ in range(200):
        k = int(rng.integers(1, 6))
        seps = [None if rng.random() < 0.2 else float(rng.choice([0.0, rng.random()]))
                for _ in range(k)]
        live = [bool(x) for x in rng.random(k) < 0.8]
        if not any(live):
            live[0] = True
        floor = float(rng.choice([0.0, rng.random(), 1.0]))
        for mode in ("uniform", "separation"):
            got = sampling_probs(seps, live, mode, floor)
            np.testing.assert_allclose(got, _reference_probs(seps, live, mode, floor), atol=1e-12)
            assert abs(got.sum() - 1.0) < 1e-12
            # The floor: no live task is drawn less than floor / n.
            assert all(p >= floor / sum(live) - 1e-12 for p, a in zip(got, live) if a)


def test_sampling_probs_errors_name_the_problem():
    with pytest.raises(ValueError, match="no live task"):
        sampling_probs([1.0], [False], "uniform", 0.1)
    with pytest.raises(ValueError, match="'greedy' is not one of"):
        sampling_probs([1.0], [True], "greedy", 0.1)


def test_separation_is_the_filters():
    from rl4mle_jax import filter as filter_lib

    assert filter_lib.separation is separation  # one definition of the statistic


def test_draw_is_seeded_by_episode_and_resumes_from_its_state():
    mix = TaskMix(["a", "b", "c"], mode="separation", floor=0.2, window=8, group=2, seed=3)
    mix.observe("a", [1.0, 1.0, 1.0, 1.0])  # a: no separation
    mix.observe("b", [0.0, 1.0, 2.0, 2.0])  # b: 1/2 of its groups separate
    first = [mix.draw(e) for e in range(300)]
    saved = mix.state_dict()
    more = [mix.draw(e) for e in range(300, 600)]
    # A fresh mix from the checkpointed state draws the same tasks for the next episodes.
    resumed = TaskMix.from_state_dict(saved)
    assert [resumed.draw(e) for e in range(300, 600)] == more
    assert resumed.drawn == mix.drawn
    # Frequencies follow p = floor/3 + 0.8 * s/Σs with s = (0, 0.5, 1 (unmeasured)).
    p = mix.probs()
    np.testing.assert_allclose(p, [0.2 / 3, 0.2 / 3 + 0.8 / 3, 0.2 / 3 + 1.6 / 3])
    freq = np.asarray([(np.asarray(first + more) == t).mean() for t in "abc"])
    assert np.abs(freq - p).max() < 0.05
    # Another seed draws otherwise.
    other = TaskMix(["a", "b", "c"], seed=4)
    assert [other.draw(e) for e in range(50)] != [TaskMix(["a", "b", "c"], seed=3).draw(e)
                                                  for e in range(50)]


def test_the_window_keeps_the_last_rewards():
    mix = TaskMix(["a"], window=4, group=2)
    mix.observe("a", [0, 1, 2, 3, 4, 5])
    assert mix.rewards["a"] == [2.0, 3.0, 4.0, 5.0]


def test_a_dropped_task_is_never_drawn_and_the_last_cannot_be_dropped():
    mix = TaskMix(["a", "b"], seed=0)
    mix.drop("a", "no separation after a rescue")
    assert {mix.draw(e) for e in range(200)} == {"b"} and mix.drawn["a"] == 0
    assert mix.probs().tolist() == [0.0, 1.0]
    with pytest.raises(ValueError, match="last live task"):
        mix.drop("b", "also")
    with pytest.raises(ValueError, match="distinct"):
        TaskMix(["a", "a"])


def _reference_group_ids(tasks, g):
    seen, out = {}, []
    for t in tasks:
        k = seen.get(t, 0)
        seen[t] = k + 1
        out.append((t, k // g if g else 0))
    return out


def test_group_ids_never_mix_tasks():
    rng = np.random.default_rng(1)
    for _ in range(100):
        b = int(rng.integers(1, 17))
        tasks = rng.integers(0, 3, b).tolist()
        g = int(rng.choice([0, 1, 2, 4]))
        ids = task_group_ids(tasks, g)
        want = _reference_group_ids(tasks, g)
        # Same partition of the rows as the reference (task, rank within task // g).
        for i in range(b):
            for j in range(b):
                assert (ids[i] == ids[j]) == (want[i] == want[j])
        for gid in set(ids.tolist()):
            assert len({tasks[i] for i in range(b) if ids[i] == gid}) == 1
    # One task: the consecutive groups prepare_batch would make.
    np.testing.assert_array_equal(task_group_ids([0] * 8, 4), np.arange(8) // 4)
