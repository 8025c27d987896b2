"""The loop's two formulas from the paper, against plain references: Δt and the improve mix."""

import random
from types import SimpleNamespace

import numpy as np
import pytest

from rl4mle_jax.rollout.buffer import SolutionBuffer
from rl4mle_jax.rollout.collate import DURATION_FLOOR_S, episode_durations
from rl4mle_jax.rollout.episode import EpisodeConfig, EpisodeRunner


def _exp(started, finished, exec_s):
    return SimpleNamespace(started_at=started, finished_at=finished, duration_s=exec_s)


def test_dt_is_dispatch_to_return_or_the_programs_own_time_with_a_floor():
    exps = [_exp(10.0, 13.5, 2.0), _exp(0.0, 0.01, 0.0), _exp(5.0, 65.0, 59.0)]
    np.testing.assert_allclose(episode_durations(exps, "episode"),
                               [3.5, DURATION_FLOOR_S, 60.0], rtol=1e-6)
    np.testing.assert_allclose(episode_durations(exps, "execution"),
                               [2.0, DURATION_FLOOR_S, 59.0], rtol=1e-6)
    np.testing.assert_allclose(episode_durations(exps, "execution", floor_s=1.0),
                               [2.0, 1.0, 59.0], rtol=1e-6)
    with pytest.raises(ValueError, match="duration source"):
        episode_durations(exps, "wall")


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0])
def test_improve_share_is_improve_prob_once_a_valid_solution_exists(p):
    buffer = SolutionBuffer()
    runner = EpisodeRunner(task=None, tokenizer=SimpleNamespace(is_chat=False), policy=None,
                           sandbox=None, instrumenter=None, buffer=buffer, context=None,
                           cfg=EpisodeConfig(improve_prob=p), reward_cfg=None, prompt_cfg=None,
                           rng=random.Random(0))
    assert {runner.make_request(i)["kind"] for i in range(50)} == {"solve"}  # nothing to improve
    buffer.add("print(1)", 0.8, episode_id=0, record={})
    kinds = [runner.make_request(i)["kind"] for i in range(4000)]
    share = kinds.count("improve") / len(kinds)
    assert share == pytest.approx(p, abs=0.03)
