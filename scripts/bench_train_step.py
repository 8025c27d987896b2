"""Throughput and model-FLOP utilisation (MFU) of the PPO `train_step`.

    .venv/bin/python scripts/bench_train_step.py                  # default sizes, batch 8 × 128
    .venv/bin/python scripts/bench_train_step.py --sizes tiny,s --batch 16 --seq 256
    .venv/bin/python scripts/bench_train_step.py --mesh 1,2,4      # data,fsdp,tensor

One train_step = 1 PPO epoch, 1 minibatch (one optimizer update each for actor and critic) on
B × T tokens with a separate-trunk critic, float32. Compilation is a warm-up, not timed; the
reported time is the median of --steps calls.

Model FLOPs per train_step (the standard 6·N rule, plus attention; no rematerialisation, no
optimizer FLOPs):
    tokens · [6·N_actor + 6·N_critic + 12 · L · T_ctx · nH · D]
    N_actor  = matmul params of the policy: L·(H·nH·D + 2·H·nKV·D + nH·D·H + 3·H·I) + H·V
    N_critic = the same trunk without the unembedding + H (value head)
    12·L·T_ctx·nH·D = QKᵀ and PV for actor and critic, forward + backward (2 models × 6),
    with T_ctx = T/2 (causal average).
MFU = model FLOPs / step time / peak, where peak is the float32 matmul rate measured in the
same run (best of a few jnp.dot calls on 2048² matrices), so MFU is relative to this machine.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from rl4mle_jax import models
from rl4mle_jax import sharding as shd
from rl4mle_jax.rl.learner import make_learner
from rl4mle_jax.rl.learner_config import LearnerConfig

SIZES = {
    "xs": dict(vocab_size=512, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16),
    "tiny": dict(vocab_size=4096, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32),
    "s": dict(vocab_size=8192, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
              num_attention_heads=8, num_key_value_heads=2, head_dim=32),
    "m": dict(vocab_size=16384, hidden_size=512, intermediate_size=1536, num_hidden_layers=6,
              num_attention_heads=8, num_key_value_heads=2, head_dim=64),
}


def matmul_peak_flops(n: int = 2048, repeats: int = 5) -> float:
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32)
    dot = jax.jit(jnp.dot)
    dot(a, b).block_until_ready()
    best = np.inf
    for _ in range(repeats):
        t = time.perf_counter()
        dot(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def matmul_params(c: models.Qwen2Config) -> tuple[int, int]:
    h, i, v = c.hidden_size, c.intermediate_size, c.vocab_size
    nq, nkv, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    layer = h * nq * d + 2 * h * nkv * d + nq * d * h + 3 * h * i
    trunk = c.num_hidden_layers * layer
    return trunk + h * v, trunk + h


def step_flops(c: models.Qwen2Config, batch: int, seq: int) -> float:
    n_actor, n_critic = matmul_params(c)
    attn = 12 * c.num_hidden_layers * (seq / 2) * c.num_attention_heads * c.head_dim
    return batch * seq * (6 * n_actor + 6 * n_critic + attn)


def make_batch(c: models.Qwen2Config, batch: int, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    response = np.zeros((batch, seq), np.int32)
    response[:, seq // 4:] = 1
    return dict(tokens=rng.integers(0, c.vocab_size, (batch, seq)).astype(np.int32),
                attention_mask=np.ones((batch, seq), np.int32), response_mask=response,
                old_logprobs=rng.normal(-np.log(c.vocab_size), 0.1,
                                        (batch, seq)).astype(np.float32),
                values_old=rng.normal(0, 0.1, (batch, seq)).astype(np.float32),
                rewards=rng.normal(size=batch).astype(np.float32),
                dt_s=rng.uniform(1, 10, batch).astype(np.float32))


def bench(name: str, batch: int, seq: int, steps: int, mesh, micro: int) -> dict:
    c = models.Qwen2Config(**SIZES[name])
    learner = make_learner(c, LearnerConfig(micro_batch_size=micro), mesh)
    params = models.init_params(c, jax.random.PRNGKey(0))
    state = learner.init_state(learner.shard_params(params), jax.random.PRNGKey(1))
    b = jax.device_put(learner.prepare_batch(make_batch(c, batch, seq)), learner.batch_sharding)
    t = time.perf_counter()
    state, metrics = learner.train_step_jit(state, b)
    jax.block_until_ready(metrics)
    compile_s = time.perf_counter() - t
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        state, metrics = learner.train_step_jit(state, b)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - t)
    n_actor, n_critic = matmul_params(c)
    return dict(name=name, params=c.num_params(), n_actor=n_actor, n_critic=n_critic,
                compile_s=compile_s, step_s=float(np.median(times)),
                flops=step_flops(c, batch, seq))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="xs,tiny,s,m")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--micro", type=int, default=0, help="micro_batch_size (0: whole batch)")
    ap.add_argument("--mesh", default="", help="data,fsdp,tensor (default: all devices on data)")
    args = ap.parse_args()
    mesh = shd.make_mesh(*map(int, args.mesh.split(","))) if args.mesh else shd.make_mesh()
    peak = matmul_peak_flops()
    print(f"devices: {len(jax.devices())} × {jax.devices()[0].platform}, mesh "
          f"{dict(mesh.shape)}; float32 matmul peak (2048² jnp.dot, best of 5)")
    print(f"batch {args.batch} × seq {args.seq}, 1 epoch, 1 minibatch, separate critic, "
          f"micro_batch_size={args.micro or 'off'}")
    rows = []
    for name in args.sizes.split(","):
        rows.append(bench(name, args.batch, args.seq, args.steps, mesh, args.micro))
    peak_after = matmul_peak_flops()
    print(f"peak measured before/after the runs: {peak / 1e9:.1f} / {peak_after / 1e9:.1f} "
          f"GFLOP/s; MFU uses the max")
    peak = max(peak, peak_after)  # a busy machine lowers one of them; keep the better
    header = (f"{'size':>5} {'params':>9} {'N_actor':>9} {'N_critic':>9} {'compile s':>9} "
              f"{'step s':>8} {'tokens/s':>9} {'GFLOP/s':>8} {'MFU':>6}")
    print(header)
    print("-" * len(header))
    for r in rows:
        tok_s = args.batch * args.seq / r["step_s"]
        achieved = r["flops"] / r["step_s"]
        print(f"{r['name']:>5} {r['params'] / 1e6:>8.2f}M {r['n_actor'] / 1e6:>8.2f}M "
              f"{r['n_critic'] / 1e6:>8.2f}M {r['compile_s']:>9.1f} {r['step_s']:>8.3f} "
              f"{tok_s:>9.0f} {achieved / 1e9:>8.1f} {achieved / peak:>6.1%}", flush=True)


if __name__ == "__main__":
    main()
