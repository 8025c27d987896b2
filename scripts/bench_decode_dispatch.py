"""Where a decode step's time goes: the engine's host loop against the same step without it.

    .venv/bin/python scripts/bench_decode_dispatch.py                   # tiny shape, seconds
    .venv/bin/python scripts/bench_decode_dispatch.py --shape 0.5b --dtype bfloat16

Three ways to advance every slot by `--tokens` tokens, timed in one run on the same state:
  engine      `Engine.step`: one jitted `generate` call, then the host reads the step's
              tokens (one device-to-host transfer and a wait per token), as the engine serves;
  async       the same jitted `generate` called back to back, nothing read until the end:
              dispatch overlaps device work, so this is the call's dispatch-or-device time;
  engine, k per call   `Engine(steps_per_call=k).step`: k generate steps in one jitted
              `lax.scan`, the host reading their tokens once per call;
  matmuls only   the step's weight matmuls alone (every projection of every layer, then the
              LM head, on `slots` rows; no attention, norms, cache or sampling): the floor any
              decode step of this model pays here, whatever its runtime.
Each row gives ms per token step and its ratio to `engine`. Random weights, every slot busy
(requests long enough that none finishes), temperature-1 sampling.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import numpy as np

sys.path.insert(0, ".")
from rl4mle_jax import models  # noqa: E402
from rl4mle_jax.engine import Engine  # noqa: E402


def fill(engine: Engine, params, prompt: int, slots: int) -> None:
    rng = np.random.default_rng(0)
    for i in range(slots):
        engine.submit(rng.integers(0, engine.config.vocab_size, prompt).tolist(),
                      jax.random.key(i))
    engine.step(params)  # inserts (prefills) every request; untimed
    jax.block_until_ready(engine._state)


def matmul_chain(params):
    """A jitted function of x [slots, hidden]: the data flow of a decode step's weight matmuls
    (q, k, v from x; o from q, standing in for attention; gate, up, down), every layer, then the
    LM head (tied or not)."""
    layers = sorted((k for k in params if k.startswith("layers_")), key=lambda k: int(k[7:]))
    head = params["lm_head"]["kernel"] if "lm_head" in params else \
        params["embed_tokens"]["embedding"].T

    def mat(k):  # [H, heads, d] -> [H, heads * d]
        return k.reshape(k.shape[0], -1)

    @jax.jit
    def run(params, x):
        for name in layers:
            attn, mlp = params[name]["self_attn"], params[name]["mlp"]
            q, k, v = (x @ mat(attn[p]["kernel"]) for p in ("q_proj", "k_proj", "v_proj"))
            a = q + k.sum(-1, keepdims=True) + v.sum(-1, keepdims=True)  # keeps k, v live
            o = attn["o_proj"]["kernel"]
            x = x + a @ o.reshape(-1, o.shape[-1])
            h = jax.nn.silu(x @ mlp["gate_proj"]["kernel"]) * (x @ mlp["up_proj"]["kernel"])
            x = x + h @ mlp["down_proj"]["kernel"]
        return x @ head
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="tiny", help="tiny or a preset such as 0.5b, 3b")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--slots", default="1,8")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--scan", default="8,32", help="steps per call of the multi-step rows")
    ap.add_argument("--prompt", type=int, default=128)
    args = ap.parse_args()
    if args.shape == "tiny":
        config = models.get_preset("tiny", vocab_size=512, num_hidden_layers=2)
    else:
        config = models.get_preset(f"qwen2.5-{args.shape}")
    config = config.replace(dtype=args.dtype, param_dtype=args.dtype)
    params = models.init_params(config, jax.random.PRNGKey(0))
    scans = [int(k) for k in args.scan.split(",")]
    n = args.tokens - args.tokens % max(scans)
    print(f"{jax.devices()[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}; "
          f"shape {args.shape} {args.dtype}, prompt {args.prompt}, {n} timed token steps")
    print("| slots | how | ms / token step | vs engine |")
    print("|---|---|---|---|")
    for slots in (int(s) for s in args.slots.split(",")):
        def warm_engine(steps_per_call, slots=slots):
            e = Engine(config, [config.vocab_size], 0, num_slots=slots,
                       prompt_buckets=(args.prompt,), max_new_tokens=n + 8,
                       steps_per_call=steps_per_call)
            e.warmup(params)
            return e

        engine = warm_engine(1)
        stops = engine._stop_ids
        rows = []

        fill(engine, params, args.prompt, slots)
        t = time.perf_counter()
        for _ in range(n):
            engine.step(params)
        rows.append(("engine", (time.perf_counter() - t) / n))
        engine.reset()

        fill(engine, params, args.prompt, slots)
        state = engine._generate(params, engine._state, stops)[0]  # same compiled program
        jax.block_until_ready(state)
        t = time.perf_counter()
        for _ in range(n):
            state, out = engine._generate(params, state, stops)
        np.asarray(out)
        rows.append(("async", (time.perf_counter() - t) / n))
        engine._state = state
        engine.reset()

        for k in scans:  # the engine itself, k token steps per call
            multi = warm_engine(k)
            fill(multi, params, args.prompt, slots)  # its first call also decodes k tokens
            t = time.perf_counter()
            for _ in range(n // k - 1):
                multi.step(params)
            rows.append((f"engine, {k} per call", (time.perf_counter() - t) / (n - k)))
        chain = matmul_chain(params)
        x = jax.numpy.ones((slots, config.hidden_size), params["embed_tokens"]["embedding"].dtype)
        jax.block_until_ready(chain(params, x))
        t = time.perf_counter()
        for _ in range(n):
            out = chain(params, x)
        jax.block_until_ready(out)
        rows.append(("matmuls only", (time.perf_counter() - t) / n))
        base = rows[0][1]
        for how, s in rows:
            print(f"| {slots} | {how} | {s * 1e3:.3f} | {base / s:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
