"""The static sampler's growing KV cache against one cache of prompt + the whole max_new bucket.

    .venv/bin/python scripts/bench_cache_phases.py                  # the default run's shapes
    .venv/bin/python scripts/bench_cache_phases.py --shape qwen2.5-0.5b --batches 1 --new 64,256

At the embedded default's shapes: the tiny preset, prompts of 480 tokens (bucket 512), the
policy's max_new_tokens 768 (bucket 1024); random weights, so no row stops early and `--new`
sets how many tokens each call decodes (the default run's responses are ~270 tokens, the
frozen copy's instrumentation answers ~300-700). Both samplers are compiled before timing; the
variants alternate call by call over `--rounds` rounds (a change in the machine's speed hits
both) and the median is kept. Prints per (batch, new tokens) the ms per decode step of each and
the ratio one cache / growing cache, and checks that both give the same tokens (greedy).
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np

from rl4mle_jax.models import get_preset, init_params
from rl4mle_jax.sampling import Sampler, cache_phases


def time_interleaved(samplers: dict, params, prompts, key, new: int, rounds: int
                     ) -> tuple[dict, dict]:
    """Greedy generate calls of each sampler in turn, `rounds` times: ({name: [seconds]},
    {name: last output}); a drift in the machine's speed hits every sampler alike."""
    times = {name: [] for name in samplers}
    outs = {}
    for _ in range(rounds):
        for name, s in samplers.items():
            t = time.perf_counter()
            outs[name] = s.generate(params, prompts, key, max_new_tokens=new, greedy=True)
            times[name].append(time.perf_counter() - t)
    return times, outs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="tiny", help="a models.presets name")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--prompt_len", type=int, default=480)
    ap.add_argument("--prompt_bucket", type=int, default=512)
    ap.add_argument("--max_new_bucket", type=int, default=1024)
    ap.add_argument("--new", default="64,270,700", help="tokens decoded per call (comma list)")
    ap.add_argument("--phase", type=int, default=128, help="the growing cache's first phase")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    config = get_preset(args.shape)
    params = init_params(config, jax.random.key(0))
    batches = [int(b) for b in args.batches.split(",")]
    news = [int(n) for n in args.new.split(",")]
    stop = config.vocab_size - 1  # random weights: a formality, rows run to max_new_tokens
    samplers = {name: Sampler(config, [stop], 0, prompt_buckets=(args.prompt_bucket,),
                              batch_buckets=tuple(batches),
                              new_token_buckets=(args.max_new_bucket,), cache_phase_tokens=ph)
                for name, ph in (("one cache", 0), ("growing", args.phase))}
    print(f"jax {jax.__version__} ({jax.default_backend()}), {args.shape}, prompt "
          f"{args.prompt_len} (bucket {args.prompt_bucket}), max_new bucket "
          f"{args.max_new_bucket}; growing cache phases "
          f"{cache_phases(args.max_new_bucket, args.phase)}; median of {args.rounds} rounds")
    rng = np.random.default_rng(0)
    key = jax.random.key(0)
    rows = []
    for b in batches:
        prompts = [list(map(int, r)) for r in rng.integers(1, stop, (b, args.prompt_len))]
        for s in samplers.values():  # compile (the loop bound is an argument: one program)
            s.generate(params, prompts, key, max_new_tokens=2, greedy=True)
        for new in news:
            times, outs = time_interleaved(samplers, params, prompts, key, new, args.rounds)
            same = all(np.array_equal(o.tokens, outs["one cache"].tokens) for o in outs.values())
            ms = {name: 1e3 * statistics.median(t) / new for name, t in times.items()}
            rows.append((b, new, ms["one cache"], ms["growing"],
                         ms["one cache"] / ms["growing"], same))
            print(f"  batch {b}, {new} new tokens: {ms['one cache']:.2f} vs "
                  f"{ms['growing']:.2f} ms/step", flush=True)
    print("\n| batch | new tokens | one cache ms/step | growing ms/step | ratio | same tokens |")
    print("|---|---|---|---|---|---|")
    for b, new, one, grown, ratio, same in rows:
        print(f"| {b} | {new} | {one:.2f} | {grown:.2f} | {ratio:.2f}x | {same} |")


if __name__ == "__main__":
    main()
