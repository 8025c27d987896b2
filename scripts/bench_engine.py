"""Benchmark the continuous-batching engine against today's merge-batch service and transformers.

    .venv/bin/python scripts/bench_engine.py                       # tiny shape, about a minute
    .venv/bin/python scripts/bench_engine.py --shapes tiny,0.5b    # adds Qwen2.5-0.5B (slow)

Workload, as the loop's episodes make it: `--requests` requests with Poisson arrivals, random
prompts, response lengths from a log-normal (`--median_len`) or a run's experience.jsonl
(`--experience`, its `response_tokens`). The arrival rate is `--load` times what the engine
serves with all slots busy (measured first), so every system is under pressure. Random weights
cannot be steered to a stop token, so each request's length is imposed: the engine frees the
slot at the request's own limit, as a stop token would; the merge-batch service and batched
transformers decode each batch to its longest member, which is what a static batch does with
real stop tokens. Systems: engine (`EngineService`), service (`GenerationService` + `Sampler`
as train.py builds them), hf_b1 (transformers' generate, one request at a time, FIFO), hf_b8
(generate on up to 8 requests that have arrived). Then two static figures: tokens/s with 8
equal requests at once (engine vs transformers) and the engine's batch-1 decode against the
memory-bandwidth bound (bandwidth / bytes of float32 weights), both from the same run.
Float32, temperature-1 sampling everywhere; compiles and first calls are warm-ups, not timed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_sampler import SHAPES, hf_model, measure_bandwidth_gbs  # noqa: E402

from rl4mle_jax.engine import Engine  # noqa: E402
from rl4mle_jax.models import load_hf_checkpoint  # noqa: E402
from rl4mle_jax.rollout.engine_service import EngineService  # noqa: E402
from rl4mle_jax.rollout.service import GenerationService  # noqa: E402
from rl4mle_jax.sampling import Sampler  # noqa: E402


class ImposedLengths:
    """Sampler stand-in for GenerationService: a merged batch decodes to its longest member."""

    def __init__(self, sampler: Sampler, lengths: dict[tuple[int, ...], int]):
        self.sampler, self.lengths = sampler, lengths
        self.stop_token_ids = sampler.stop_token_ids

    def generate(self, params, prompts, rng, **kw):
        kw["max_new_tokens"] = max(self.lengths[tuple(p)] for p in prompts)
        return self.sampler.generate(params, prompts, rng, **kw)


def workload(args, vocab: int, seed: int = 0):
    """Prompts, response lengths and arrival times for 1 request/s (divide by the rate)."""
    rng = np.random.default_rng(seed)
    n = args.requests
    if args.experience:
        with open(args.experience) as f:
            pool = [r["response_tokens"] for r in map(json.loads, f) if r.get("response_tokens")]
        lengths = rng.choice(pool, n)
    else:
        lengths = rng.lognormal(np.log(args.median_len), 0.6, n)
    lengths = np.clip(np.round(lengths), 4, args.max_new).astype(int)
    top = args.prompt_buckets[-1]
    prompts = [rng.integers(0, vocab, rng.integers(top // 8, top + 1)).tolist() for _ in range(n)]
    arrivals = np.cumsum(rng.exponential(1.0, n))
    return prompts, lengths.tolist(), arrivals - arrivals[0]


def summarize(name, arrivals, finish, lengths):
    lat = np.asarray(finish) - arrivals
    tps = sum(lengths) / (max(finish) - arrivals[0])
    return dict(system=name, tokens=int(sum(lengths)), tps=tps, p50=float(np.percentile(lat, 50)),
                p95=float(np.percentile(lat, 95)))


async def drive(service, prompts, lengths, arrivals, per_request_limit: bool):
    """Real-time Poisson client; returns each request's finish time (s from the first)."""
    loop = asyncio.get_running_loop()
    service.start()
    t0 = loop.time()
    finish = [0.0] * len(prompts)

    async def one(i):
        await asyncio.sleep(max(0.0, t0 + arrivals[i] - loop.time()))
        extra = (lengths[i],) if per_request_limit else ()
        gen = await service.generate(prompts[i], *extra)
        assert len(gen.response_ids) >= lengths[i]
        finish[i] = loop.time() - t0

    await asyncio.gather(*(one(i) for i in range(len(prompts))))
    await service.stop()
    return finish


def hf_generate(model, prompts, new):
    p = max(map(len, prompts))
    ids = torch.tensor([[0] * (p - len(x)) + x for x in prompts])
    mask = torch.tensor([[0] * (p - len(x)) + [1] * len(x) for x in prompts])
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                       do_sample=True, top_k=0, top_p=1.0, temperature=1.0, pad_token_id=0,
                       eos_token_id=None)


def drive_hf(model, prompts, lengths, arrivals, batch):
    """Serves arrived requests FIFO, up to `batch` per generate call, each to its longest."""
    t0, i, finish = time.perf_counter(), 0, [0.0] * len(prompts)
    while i < len(prompts):
        time.sleep(max(0.0, arrivals[i] - (time.perf_counter() - t0)))
        now, j = time.perf_counter() - t0, i + 1
        while j < len(prompts) and j - i < batch and arrivals[j] <= now:
            j += 1
        hf_generate(model, prompts[i:j], max(lengths[i:j]))
        finish[i:j] = [time.perf_counter() - t0] * (j - i)
        i = j
    return finish


def engine_tps(engine, params, prompts, new, decode_only: bool) -> float:
    """Tokens/s with len(prompts) requests in flight; `decode_only` leaves out the first call,
    which holds the prefills (for the bandwidth bound, which is about decoding)."""
    t = time.perf_counter()
    for i, p in enumerate(prompts):
        engine.submit(p, jax.random.key(i), max_new_tokens=new)
    engine.step(params)
    first = min(new, engine.steps_per_call) if decode_only else 0  # tokens of the first call
    if decode_only:
        t = time.perf_counter()
    engine.run(params)
    return len(prompts) * (new - first) / (time.perf_counter() - t)


def bench_shape(shape, args, bw):
    with tempfile.TemporaryDirectory() as d:
        model = hf_model(SHAPES[shape], d)
        config, params = load_hf_checkpoint(d)
    n_params = sum(x.size for x in jax.tree.leaves(params))
    bw = max(bw, measure_bandwidth_gbs())
    stop = [config.vocab_size]  # never sampled: lengths are imposed (see the docstring)
    kw = dict(prompt_buckets=args.prompt_buckets, max_new_tokens=args.max_new,
              steps_per_call=args.steps_per_call)
    engine = Engine(config, stop, 0, num_slots=args.slots, **kw)
    engine.warmup(params)
    one = Engine(config, stop, 0, num_slots=1, **kw)
    one.warmup(params)
    rng = np.random.default_rng(1)
    static = [rng.integers(0, config.vocab_size, 32).tolist() for _ in range(args.slots)]
    full_tps = engine_tps(engine, params, static, args.static_len, False)
    b1_tps = engine_tps(one, params, static[:1], args.static_len, True)
    hf_generate(model, static, 2)  # warm-up
    t = time.perf_counter()
    hf_generate(model, static, args.static_len)
    hf_b8_tps = len(static) * args.static_len / (time.perf_counter() - t)
    print(f"  {shape}: engine {full_tps:.1f} tok/s with {args.slots} busy slots, batch-1 "
          f"{b1_tps:.1f}; transformers batch {args.slots} {hf_b8_tps:.1f}", flush=True)

    prompts, lengths, arrivals = workload(args, config.vocab_size)
    rate = args.load * full_tps / np.mean(lengths)
    arrivals = arrivals / rate
    sampler = Sampler(config, stop, 0, prompt_buckets=args.prompt_buckets,
                      batch_buckets=(1, 2, 4, 8), new_token_buckets=(args.max_new,))
    for b in (1, 2, 4, 8):  # compile every bucket the merged batches can hit
        for p in args.prompt_buckets:
            sampler.generate(params, [[1] * p] * b, jax.random.key(0), max_new_tokens=2)
    lane = ThreadPoolExecutor(1)
    systems = {
        "engine": lambda: asyncio.run(drive(EngineService(
            engine, lambda: (params, 0), lane, jax.random.key(1), temperature=1.0),
            prompts, lengths, arrivals, True)),
        "service": lambda: asyncio.run(drive(GenerationService(
            ImposedLengths(sampler, {tuple(p): n for p, n in zip(prompts, lengths)}),
            lambda: (params, 0), lane, jax.random.key(2), max_batch=8, temperature=1.0),
            prompts, lengths, arrivals, False)),
        "hf_b1": lambda: drive_hf(model, prompts, lengths, arrivals, 1),
        "hf_b8": lambda: drive_hf(model, prompts, lengths, arrivals, 8),
    }
    rows = []
    for name, run in systems.items():
        if name.startswith("hf") and args.skip_hf_async:
            continue
        rows.append(dict(shape=shape, **summarize(name, arrivals, run(), lengths)))
        print(f"  {shape} {name}: {rows[-1]['tps']:.1f} tok/s, p50 {rows[-1]['p50']:.2f} s, "
              f"p95 {rows[-1]['p95']:.2f} s", flush=True)
    lane.shutdown()
    bound = bw * 1e9 / (4 * n_params)  # batch 1 reads every float32 weight once per token
    fig = dict(shape=shape, params=f"{n_params / 1e6:.1f}M", rate=rate, engine_b8=full_tps,
               hf_b8=hf_b8_tps, b1=b1_tps, bound=bound, bw=bw,
               compiles=dict(engine.num_traces))
    return rows, fig


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="tiny", help=f"comma list of {sorted(SHAPES)}")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--median_len", type=int, default=48)
    ap.add_argument("--max_new", type=int, default=128)
    ap.add_argument("--experience", default="", help="experience.jsonl to draw lengths from")
    ap.add_argument("--load", type=float, default=2.0,
                    help="arrival rate as a multiple of the engine's full-slot throughput "
                         "(above 1, so that tokens/s measures each system, not the arrivals)")
    ap.add_argument("--prompt_buckets", default="16,32,64",
                    help="for both the engine and the Sampler; prompts are 1/8 to all of the "
                         "largest")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--static_len", type=int, default=32)
    ap.add_argument("--steps_per_call", type=int, default=1,
                    help="the engine's token steps per jitted call (rl4mle_jax.engine)")
    ap.add_argument("--skip_hf_async", action="store_true",
                    help="leave transformers out of the arrival workload (slow at 0.5B)")
    args = ap.parse_args()
    args.prompt_buckets = tuple(int(b) for b in args.prompt_buckets.split(","))
    torch.set_num_threads(os.cpu_count() or 1)
    bw = measure_bandwidth_gbs()
    print(f"jax {jax.__version__} ({jax.default_backend()}), torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {os.cpu_count()} CPUs; load average "
          f"{os.getloadavg()}")
    rows, figs = [], []
    for shape in args.shapes.split(","):
        r, f = bench_shape(shape, args, bw)
        rows += r
        figs.append(f)
    src = f"from {args.experience}" if args.experience else f"log-normal, median {args.median_len}"
    print(f"\nload average {os.getloadavg()}; {args.requests} requests per system, lengths {src}"
          f" (max {args.max_new}), {args.slots} slots / max batch, engine "
          f"{args.steps_per_call} step(s) per call")
    print("| shape | system | req/s offered | tokens | tok/s | p50 latency s | p95 latency s |")
    print("|---|---|---|---|---|---|---|")
    rate = {f["shape"]: f["rate"] for f in figs}
    for r in rows:
        print(f"| {r['shape']} | {r['system']} | {rate[r['shape']]:.2f} | {r['tokens']} | "
              f"{r['tps']:.1f} | {r['p50']:.2f} | {r['p95']:.2f} |")
    print(f"\n| shape | params | engine {args.slots} slots tok/s | transformers batch "
          f"{args.slots} tok/s | ratio | engine batch-1 tok/s | bandwidth bound tok/s "
          f"(GB/s) | fraction | traces |")
    print("|---|---|---|---|---|---|---|---|---|")
    for f in figs:
        print(f"| {f['shape']} | {f['params']} | {f['engine_b8']:.1f} | {f['hf_b8']:.1f} | "
              f"{f['engine_b8'] / f['hf_b8']:.2f}x | {f['b1']:.1f} | {f['bound']:.1f} "
              f"({f['bw']:.1f}) | {f['b1'] / f['bound']:.2f} | {f['compiles']} |")
    last = figs[-1]  # the last shape given (put 0.5b last for the figures)
    tps = {r["system"]: r["tps"] for r in rows if r["shape"] == last["shape"]}
    print(f"ratio_vs_service={tps['engine'] / tps['service']:.2f} "
          f"ratio_vs_hf_b8={last['engine_b8'] / last['hf_b8']:.2f} "
          f"b1_bandwidth_fraction={last['b1'] / last['bound']:.2f}")


if __name__ == "__main__":
    main()
