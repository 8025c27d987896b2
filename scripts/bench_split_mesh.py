"""Sampler idle fraction during learning and sampler/learner throughput: split devices vs one lane.

    .venv/bin/python scripts/bench_split_mesh.py                    # 8 CPU devices, 4 + 4
    .venv/bin/python scripts/bench_split_mesh.py --steps 8 --sampler_devices 2 --size s

Modes, measured in the same run on the same model and batches:
    one lane     today's default with one mesh: sampler and learner share all devices
                 (mesh.data=-1) and take turns on one device lane
    lane, N+M    the split meshes (the sampler's N devices tensor-parallel, the learner's M
                 data-parallel) but still one lane: isolates what the second lane buys
    split, N+M   mesh.sampler_devices=N: the sampler has its own lane and the learner
                 publishes each version to it (rollout.publish), as train.py runs it

In each mode --clients coroutines keep the policy's GenerationService saturated while the
learner runs --steps train steps back to back, publishing after each (as `_Trainer._learn`).
Reported: the sampler's idle fraction during the train steps (BusySpans, as the
`sampler/idle_frac_during_learn` metric), sampler tokens/s and learner steps/s over the
measured window, and each mode's ratio to "one lane". Compilation is a warm-up, not timed.

On virtual CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count, set here when unset)
all "devices" share the host's cores: the split cannot add compute, only overlap, and the
one-mesh sampler repeats its work on every device (replicated params), so its throughput is
not a GPU's. The idle fraction is the number that carries over.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import concurrent.futures  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from rl4mle_jax import models  # noqa: E402
from rl4mle_jax import sharding as shd  # noqa: E402
from rl4mle_jax.rl.learner import make_learner  # noqa: E402
from rl4mle_jax.rl.learner_config import LearnerConfig  # noqa: E402
from rl4mle_jax.rollout.publish import WeightPublisher, param_shardings  # noqa: E402
from rl4mle_jax.rollout.service import BusySpans, GenerationService  # noqa: E402
from rl4mle_jax.sampling import Sampler  # noqa: E402

SIZES = {
    "xs": dict(vocab_size=512, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16),
    "s": dict(vocab_size=2048, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, head_dim=32),
}
STOP = 1


def _batch(b: int, prompt: int, response: int, vocab: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    t = prompt + response
    resp = np.zeros((b, t), np.float32)
    resp[:, prompt:] = 1.0
    return dict(tokens=rng.integers(2, vocab, (b, t)).astype(np.int32),
                attention_mask=np.ones((b, t), np.int32), response_mask=resp,
                old_logprobs=np.full((b, t), -np.log(vocab), np.float32),
                rewards=rng.normal(size=b).astype(np.float32),
                dt_s=rng.uniform(1, 5, b).astype(np.float32))


def run_mode(name: str, sampler_devices: int, own_lane: bool, mc: models.Qwen2Config,
             params, args) -> dict:
    meshes = shd.make_meshes(sampler_devices=sampler_devices)
    learner = make_learner(mc, LearnerConfig(actor_lr=1e-4, critic_lr=1e-4), meshes.learner)
    lane = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="device-lane")
    sampler_lane = (concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sampler-lane")
                    if own_lane else lane)
    publisher = WeightPublisher(param_shardings(mc, meshes.sampler)
                                if meshes.sampler is not None else None)
    sampler = Sampler(mc, [STOP], 0, prompt_buckets=(args.prompt,),
                      batch_buckets=(args.sampler_batch,), new_token_buckets=(args.response,))
    busy = BusySpans()
    batch = _batch(args.batch, args.prompt, args.response, mc.vocab_size)
    state = {"s": learner.init_state(learner.shard_params(params), jax.random.PRNGKey(1)),
             "version": 0}
    publisher.publish(state["s"].policy_params, 0)
    prompts = np.random.default_rng(1).integers(2, mc.vocab_size, (64, args.prompt - 1))

    def learn() -> tuple[float, float]:
        t0 = time.perf_counter()
        state["s"], metrics = learner.train_step(state["s"], batch)
        jax.device_get(metrics)
        state["version"] += 1
        publisher.publish(state["s"].policy_params, state["version"])
        return t0, time.perf_counter()

    async def main() -> dict:
        svc = GenerationService(sampler, publisher.latest, sampler_lane, jax.random.PRNGKey(2),
                                max_batch=args.sampler_batch, max_wait_s=0.005, busy=busy,
                                max_new_tokens=args.response, temperature=1.0,
                                stop_token_ids=[mc.vocab_size + 1])  # never stops early
        svc.start()
        loop = asyncio.get_running_loop()
        done: list[tuple[float, int]] = []  # (finish time, tokens)
        stop = asyncio.Event()

        async def client(i: int) -> None:
            k = i
            while not stop.is_set():
                gen = await svc.generate(prompts[k % len(prompts)].tolist())
                done.append((time.perf_counter(), len(gen.response_ids)))
                k += args.clients

        await svc.generate(prompts[0].tolist())  # compile the sampler
        await loop.run_in_executor(lane, learn)  # compile the train step
        clients = [asyncio.create_task(client(i)) for i in range(args.clients)]
        await asyncio.sleep(0.5)  # the clients fill the queue
        w0 = time.perf_counter()
        spans = [await loop.run_in_executor(lane, learn) for _ in range(args.steps)]
        w1 = time.perf_counter()
        stop.set()
        await asyncio.gather(*clients)
        await svc.stop()
        learn_s = sum(t1 - t0 for t0, t1 in spans)
        idle = 1.0 - sum(busy.busy_s(t0, t1) for t0, t1 in spans) / learn_s
        tokens = sum(n for t, n in done if w0 <= t <= w1)
        return {"mode": name, "idle": idle, "tokens_s": tokens / (w1 - w0),
                "steps_s": args.steps / (w1 - w0), "step_s": learn_s / args.steps,
                "window_s": w1 - w0}

    try:
        return asyncio.run(main())
    finally:
        lane.shutdown()
        sampler_lane.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", default="xs", choices=sorted(SIZES))
    p.add_argument("--sampler_devices", type=int, default=4)
    p.add_argument("--steps", type=int, default=20, help="train steps measured per mode")
    p.add_argument("--batch", type=int, default=8, help="learner batch rows")
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens (sampler and learner)")
    p.add_argument("--response", type=int, default=64, help="response tokens")
    p.add_argument("--sampler_batch", type=int, default=4, help="requests per sampler call")
    p.add_argument("--clients", type=int, default=8, help="concurrent generate() callers")
    args = p.parse_args()
    n, m = args.sampler_devices, jax.device_count() - args.sampler_devices
    mc = models.Qwen2Config(**SIZES[args.size])
    params = models.init_params(mc, jax.random.PRNGKey(0))
    print(f"{jax.device_count()} {jax.devices()[0].platform} devices, model {args.size} "
          f"({mc.num_params() / 1e6:.2f} M params), learner batch {args.batch} × "
          f"{args.prompt + args.response}, sampler calls of {args.sampler_batch} × "
          f"{args.response} new tokens, {args.clients} clients, {args.steps} steps per mode")
    rows = [run_mode("one lane", 0, False, mc, params, args),
            run_mode(f"lane, {n}+{m}", n, False, mc, params, args),
            run_mode(f"split, {n}+{m}", n, True, mc, params, args)]
    base = rows[0]
    print(f"\n{'mode':<14} {'sampler idle during learn':>26} {'sampler tok/s':>14} "
          f"{'learner steps/s':>16} {'s/step':>8} {'tok/s ratio':>12} {'steps/s ratio':>14}")
    for r in rows:
        print(f"{r['mode']:<14} {r['idle']:>26.3f} {r['tokens_s']:>14.1f} {r['steps_s']:>16.3f} "
              f"{r['step_s']:>8.3f} {r['tokens_s'] / base['tokens_s']:>12.2f} "
              f"{r['steps_s'] / base['steps_s']:>14.2f}")
    split, lane = rows[2], rows[1]
    print(f"\nsplit vs one lane: sampler idle during learning {base['idle']:.3f} → "
          f"{split['idle']:.3f}; sampler throughput ×{split['tokens_s'] / base['tokens_s']:.2f}, "
          f"learner throughput ×{split['steps_s'] / base['steps_s']:.2f} "
          f"(vs the same meshes on one lane: ×{split['tokens_s'] / lane['tokens_s']:.2f}, "
          f"×{split['steps_s'] / lane['steps_s']:.2f})")


if __name__ == "__main__":
    main()
