"""The sampler with its prefill's causal attention in chunks (the default, 128 query rows)
against one block (attention_chunk=0), at the embedded default's shapes.

    .venv/bin/python scripts/bench_attention_chunks.py
    .venv/bin/python scripts/bench_attention_chunks.py --prompts 480:512,1000:1024 --new 1,270

The tiny preset with random weights, greedy, so every row decodes `--new` tokens; prompts of
480 tokens (bucket 512: the policy's) and 1000 (bucket 1024: the frozen copy's instrumentation
prompts run up to ~1500 tokens). Per (prompt, batch, new tokens): the median wall-clock of
interleaved calls of each variant (a drift in the machine's speed hits both), their ratio, and
whether the tokens are the same. new=1 is essentially the prefill. The learner's side is
`scripts/bench_train_step.py --real --modes one-block,default`.
"""

from __future__ import annotations

import argparse
import statistics

import jax
import numpy as np
from bench_cache_phases import time_interleaved  # scripts/ is on the path: run as a script

from rl4mle_jax.models import get_preset, init_params
from rl4mle_jax.sampling import Sampler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default="480:512,1000:1024", help="length:bucket,...")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--new", default="1,270", help="tokens decoded per call (comma list)")
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    config = get_preset("tiny")
    params = init_params(config, jax.random.key(0))
    stop = config.vocab_size - 1  # random weights: rows run to max_new_tokens
    rng, key = np.random.default_rng(0), jax.random.key(0)
    print(f"jax {jax.__version__} ({jax.default_backend()}), tiny preset, greedy; median of "
          f"{args.rounds} interleaved rounds")
    print(f"{'prompt':>6} {'batch':>5} {'new':>4} {'one block s':>11} {'chunks s':>9} "
          f"{'ratio':>6} same")
    for spec in args.prompts.split(","):
        length, bucket = (int(x) for x in spec.split(":"))
        for b in (int(x) for x in args.batches.split(",")):
            prompts = [list(map(int, r)) for r in rng.integers(1, stop, (b, length))]
            samplers = {chunk: Sampler(config, [stop], 0, prompt_buckets=(bucket,),
                                       batch_buckets=(b,), new_token_buckets=(1024,),
                                       attention_chunk=chunk)
                        for chunk in (0, args.chunk)}
            for s in samplers.values():  # compile
                s.generate(params, prompts, key, max_new_tokens=2, greedy=True)
            for new in (int(x) for x in args.new.split(",")):
                times, out = time_interleaved(samplers, params, prompts, key, new, args.rounds)
                one, ch = (statistics.median(times[c]) for c in samplers)
                same = bool(np.array_equal(out[0].tokens, out[args.chunk].tokens))
                print(f"{length:>6} {b:>5} {new:>4} {one:>11.3f} {ch:>9.3f} {one / ch:>5.2f}x "
                      f"{same}", flush=True)


if __name__ == "__main__":
    main()
