"""The generation service merges requests that are waiting into one sampler call."""

import asyncio
import concurrent.futures

import jax
import pytest

from rl4mle_jax import models
from rl4mle_jax.rollout.service import GenerationService
from rl4mle_jax.sampling import Sampler

TINY = models.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=8)


@pytest.mark.parametrize("max_wait_s", [0.0, 0.05])
def test_waiting_requests_share_one_call(max_wait_s):
    params = models.init_params(TINY, jax.random.PRNGKey(0))
    sampler = Sampler(TINY, [63], 0, prompt_buckets=(8,), batch_buckets=(1, 2, 4),
                      max_new_tokens=4)
    lane = concurrent.futures.ThreadPoolExecutor(1)

    async def main():
        svc = GenerationService(sampler, lambda: (params, 3), lane, jax.random.PRNGKey(1),
                                max_batch=4, max_wait_s=max_wait_s, max_new_tokens=4)
        svc.start()
        gens = await asyncio.gather(*(svc.generate([1, 2, i + 3]) for i in range(4)))
        await svc.stop()
        return svc, gens

    svc, gens = asyncio.run(main())
    lane.shutdown()
    assert svc.requests == 4 and svc.calls == 1  # queued together: one batch, even at wait 0
    assert [g.prompt_ids[-1] for g in gens] == [3, 4, 5, 6]
    assert all(g.params_version == 3 and 1 <= len(g.response_ids) <= 4 for g in gens)
