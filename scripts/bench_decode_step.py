"""What a decode step of the policy costs, and how much of it is the attention over the KV cache.

    .venv/bin/python scripts/bench_decode_step.py                      # the default run's shapes
    .venv/bin/python scripts/bench_decode_step.py --batches 1,4 --slots 768,1536 --rounds 7

A jitted loop of `--steps` decode steps (`models.forward` of one token per row over a cache of
`--slots` slots, the first 78% of them real keys, the cache written in place at each step's
slot, greedy next token), random weights of `--shape`. Two variants, alternating round by round
(a drift of the machine's speed hits both), the median kept:
    step           the model's decode step as it is
    no attention   the same step with the attention over the cache replaced by its query (the
                   projections, MLP, norms, cache writes and output layer stay): what is left
                   when the cache attention costs nothing
Prints ms per decode step of each, per batch row, and the attention's share
(1 - no attention / step). The default run's sampler decodes batches of 1-4 rows over caches of
640-1536 slots (a 512-token prompt bucket plus the growing phases of sampling.cache_phases).
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

import rl4mle_jax.models.qwen2 as qwen2
from rl4mle_jax.models import forward, get_preset, init_cache, init_params

_ATTEND = qwen2._attend


def _no_cache_attention(q, k, v, allowed, dt):
    """The attention of a decode step (one query row) replaced by its query."""
    b, t, _, _, d = q.shape
    if t != 1:
        return _ATTEND(q, k, v, allowed, dt)
    return q.reshape(b, t, -1, d)


def decode_loop(config, batch: int, slots: int, steps: int, attention: bool):
    """A jitted function running `steps` decode steps from a cache filled to 78%."""
    filled = int(0.78 * slots)

    def run(params, cache, tok):
        def body(i, state):
            cache, tok = state
            logits, cache = forward(config, params, tok[:, None],
                                    jnp.full((batch, 1), filled) + i,
                                    jnp.ones((batch, 1), jnp.int32), cache=cache,
                                    cache_index=filled + i)
            return cache, jnp.argmax(logits[:, -1], -1).astype(jnp.int32)

        qwen2._attend = _ATTEND if attention else _no_cache_attention
        try:  # traced here, under the chosen attention
            return jax.lax.fori_loop(0, steps, body, (cache, tok))
        finally:
            qwen2._attend = _ATTEND

    cache = init_cache(config, batch, slots)
    cache = cache._replace(mask=(jnp.arange(slots) < filled).astype(jnp.int32)[None]
                           .repeat(batch, 0))
    return jax.jit(run), cache


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="tiny", help="a models.presets name")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--slots", default="640,1024", help="cache slots (comma list)")
    ap.add_argument("--steps", type=int, default=32, help="decode steps per timed call")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    config = get_preset(args.shape)
    params = init_params(config, jax.random.key(0))
    print(f"jax {jax.__version__} ({jax.default_backend()}), {args.shape}, {args.steps} steps "
          f"per call, median of {args.rounds} rounds")
    print("| batch | cache slots | step ms | no attention ms | step ms per row | "
          "attention share |")
    print("|---|---|---|---|---|---|")
    for slots in (int(s) for s in args.slots.split(",")):
        for b in (int(x) for x in args.batches.split(",")):
            tok = jnp.zeros((b,), jnp.int32)
            fns = {name: decode_loop(config, b, slots, args.steps, attention)
                   for name, attention in (("step", True), ("no attention", False))}
            for fn, cache in fns.values():  # compile
                jax.block_until_ready(fn(params, cache, tok))
            times = {name: [] for name in fns}
            for _ in range(args.rounds):
                for name, (fn, cache) in fns.items():
                    t = time.perf_counter()
                    jax.block_until_ready(fn(params, cache, tok))
                    times[name].append(time.perf_counter() - t)
            ms = {k: 1e3 * statistics.median(v) / args.steps for k, v in times.items()}
            print(f"| {b} | {slots} | {ms['step']:.2f} | {ms['no attention']:.2f} | "
                  f"{ms['step'] / b:.2f} | {1 - ms['no attention'] / ms['step']:.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
