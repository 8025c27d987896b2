"""Episodes → learner batch: alignment of prompt, response, behaviour log-probs and Δt."""

import types

import numpy as np
import pytest

from rl4mle_jax.rollout.collate import build_batch, episode_durations


def _exp(i, prompt, resp, logp, reward, started=0.0, finished=1.0, duration_s=0.0):
    return types.SimpleNamespace(episode_id=i, prompt_ids=prompt, response_ids=resp,
                                 logprobs=logp, reward=reward, started_at=started,
                                 finished_at=finished, duration_s=duration_s)


def test_build_batch_layout():
    exps = [_exp(0, [5, 6], [7, 8, 9], [-0.1, -0.2, -0.3], 1.0, 0.0, 2.0, 1.5),
            _exp(1, [4], [3], [-0.5], -10.0, 1.0, 1.5, 0.0)]
    b = build_batch(exps, max_prompt=3, max_response=4, pad_id=0)
    np.testing.assert_array_equal(b["tokens"], [[0, 5, 6, 7, 8, 9, 0], [0, 0, 4, 3, 0, 0, 0]])
    np.testing.assert_array_equal(b["attention_mask"], [[0, 1, 1, 1, 1, 1, 0],
                                                        [0, 0, 1, 1, 0, 0, 0]])
    np.testing.assert_array_equal(b["response_mask"], [[0, 0, 0, 1, 1, 1, 0],
                                                       [0, 0, 0, 1, 0, 0, 0]])
    np.testing.assert_allclose(b["old_logprobs"][0], [0, 0, 0, -0.1, -0.2, -0.3, 0])
    np.testing.assert_allclose(b["old_logprobs"][1], [0, 0, 0, -0.5, 0, 0, 0])
    np.testing.assert_allclose(b["rewards"], [1.0, -10.0])
    np.testing.assert_allclose(b["dt_s"], [2.0, 0.5])
    np.testing.assert_allclose(episode_durations(exps, "execution"), [1.5, 0.05])


def test_build_batch_errors_name_the_episode():
    with pytest.raises(ValueError, match="episode 3: prompt has 4 tokens, over max_prompt"):
        build_batch([_exp(3, [1, 2, 3, 4], [5], [0.0], 0.0)], 3, 4, 0)
    with pytest.raises(ValueError, match="episode 4: 2 logprobs for 1 response tokens"):
        build_batch([_exp(4, [1], [5], [0.0, 0.0], 0.0)], 3, 4, 0)
    with pytest.raises(ValueError, match="duration source"):
        episode_durations([], "cpu")
