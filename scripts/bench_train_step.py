"""Throughput and model-FLOP utilisation (MFU) of the PPO `train_step`.

    .venv/bin/python scripts/bench_train_step.py                  # default sizes, batch 8 × 128
    .venv/bin/python scripts/bench_train_step.py --sizes tiny,s --batch 16 --seq 256
    .venv/bin/python scripts/bench_train_step.py --mesh 1,2,4      # data,fsdp,tensor
    .venv/bin/python scripts/bench_train_step.py --real            # the default run's batches

--real: the learner step of the default run (configs/task.py) on batches of its real lengths:
the warm start's model (preset "tiny"), batch 8, prompts of ~480 and responses of ~265 tokens
(the lengths the default run sees; limits 512 + 768), timed as train.py's `_learn` runs it
(old-values pass when there is one + train_step). Modes, interleaved (one step of each in
turn, --steps rounds, median):
    before         pad to 512 + 768, separate old-values forward, then train_step
    bucket         pad to the length bucket (run.length_bucket), separate old-values forward
    all-logits     pad to the bucket, old values from the step's own forward, the logits of
                   every position, the prompt's too (the step before learner.logits_start;
                   "before" and "bucket" compute them too)
    bucket+fused   the same, logits from where the responses start (learner.logits_start;
                   the default)
    shared         the same with critic="shared" (value head on the policy trunk)
    none-grpo      critic="none", advantage_estimator="grpo" (rloo costs the same step)
    one-block      configs/task.py's learner, attention as one [T, T] block per layer
    default        configs/task.py's learner as it is (causal chunks of 128 query rows;
                   --modes one-block,default prints the chunks' ratio)
It prints time per step and per episode, each mode's ratio to "before", and the learner steps
that fit in 300 s if the learner had the device lane to itself.

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
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from rl4mle_jax import models
from rl4mle_jax import sharding as shd
from rl4mle_jax.rl.batch import old_values_in_step
from rl4mle_jax.rl.learner import make_learner
from rl4mle_jax.rl.learner_config import LearnerConfig
from rl4mle_jax.rollout.collate import build_batch

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


# ------------------------------------------------------------------- --real: the default run
REAL_MODES = {  # name -> (length_bucket, separate old-values pass, learner overrides,
    #                  logits of every position instead of from the responses' start)
    "before": (0, True, {}, True),
    "bucket": (64, True, {}, True),
    "all-logits": (64, False, {}, True),
    "bucket+fused": (64, False, {}, False),
    "shared": (64, False, dict(critic="shared"), False),
    "none-grpo": (64, False, dict(critic="none", advantage_estimator="grpo", group_size=4),
                  False),
    # configs/task.py's learner as it is (critic-free, leave-one-out) with its attention in
    # one [T, T] block per layer, and with the default's causal chunks of 128 query rows.
    "one-block": (64, False, dict(attention_chunk=0), False),
    "default": (64, False, {}, False),
}


def real_experiences(c: models.Qwen2Config, batch: int, prompt_mean: int, response_mean: int,
                     max_prompt: int, max_response: int, seed: int = 0) -> list:
    """Fake finished episodes with the default run's lengths (random tokens)."""
    import types
    rng = np.random.default_rng(seed)
    out = []
    for i in range(batch):
        n_p = int(np.clip(rng.normal(prompt_mean, 15), 1, max_prompt))
        n_r = int(np.clip(rng.normal(response_mean, 80), 1, max_response))
        out.append(types.SimpleNamespace(
            episode_id=i, prompt_ids=rng.integers(0, c.vocab_size, n_p).tolist(),
            response_ids=rng.integers(0, c.vocab_size, n_r).tolist(),
            logprobs=rng.normal(-2.0, 0.5, n_r).tolist(), reward=float(rng.normal()),
            started_at=0.0, finished_at=float(rng.uniform(1, 30)), duration_s=1.0))
    return out


def bench_real(args, mesh) -> None:
    import dataclasses

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # configs/
    from configs import task as task_config
    from rl4mle_jax.warmstart.config import WarmStartConfig

    cfg = task_config.get_config()
    c = models.get_preset(WarmStartConfig().preset, vocab_size=WarmStartConfig().vocab_size)
    base = LearnerConfig.from_dict(cfg.learner)
    p_max, r_max = cfg.prompt.max_prompt_tokens, cfg.prompt.max_response_tokens
    exps = real_experiences(c, args.batch, args.prompt_len, args.response_len, p_max, r_max)
    params = models.init_params(c, jax.random.PRNGKey(0))
    modes = [m for m in args.modes.split(",")]
    print(f"model preset {WarmStartConfig().preset!r} ({c.num_params() / 1e6:.2f}M params), "
          f"batch {args.batch}, prompt/response mean {args.prompt_len}/{args.response_len} "
          f"tokens (limits {p_max}/{r_max}); devices: {len(jax.devices())} × "
          f"{jax.devices()[0].platform}")
    runs = {}
    for name in modes:
        bucket, two_pass, over, all_logits = REAL_MODES[name]
        lc = dataclasses.replace(base, **over)
        learner = make_learner(c, lc, mesh)
        state = learner.init_state(learner.shard_params(params), jax.random.PRNGKey(1))
        arrays = build_batch(exps, p_max, r_max, 0, length_bucket=bucket)
        two_pass = two_pass or not old_values_in_step(lc)
        runs[name] = dict(learner=learner, state=state, arrays=arrays, two_pass=two_pass,
                          all_logits=all_logits)

    def one_step(r):
        learner, arrays = r["learner"], dict(r["arrays"])
        t = time.perf_counter()
        if r["two_pass"] and learner.config.uses_critic:
            out = learner.compute_logprobs_and_values(
                r["state"].policy_params, r["state"].critic_params, arrays["tokens"],
                arrays["attention_mask"])
            arrays["values_old"] = out["values"]
        if r["all_logits"]:  # logits_from=0: the unembedding over prompt positions too
            batch, _ = learner.step_inputs(arrays)
            r["state"], metrics = learner.train_step_jit(r["state"], batch, 0)
        else:
            r["state"], metrics = learner.train_step(r["state"], arrays)
        jax.block_until_ready(metrics)
        return time.perf_counter() - t

    for name in modes:  # the first call of each compiles
        runs[name]["compile_s"] = one_step(runs[name])
    times = {name: [] for name in modes}
    for _ in range(args.steps):
        for name in modes:
            times[name].append(one_step(runs[name]))
    ref = float(np.median(times[modes[0]]))
    header = (f"{'mode':>13} {'shape':>9} {'1st call s':>10} {'step s':>7} {'s/episode':>9} "
              f"{'vs ' + modes[0]:>10} {'steps/300s':>10}")
    print(header)
    print("-" * len(header))
    for name in modes:
        step = float(np.median(times[name]))
        b, t = runs[name]["arrays"]["tokens"].shape
        print(f"{name:>13} {b:>3}×{t:<5} {runs[name]['compile_s']:>10.1f} {step:>7.2f} "
              f"{step / b:>9.3f} {ref / step:>9.2f}× {300 / step:>10.0f}", flush=True)
    print(f"median of {args.steps} interleaved rounds; '1st call' includes compiling; "
          f"steps/300s = 300 / step s (the learner alone on the device lane)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="xs,tiny,s,m")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--micro", type=int, default=0, help="micro_batch_size (0: whole batch)")
    ap.add_argument("--mesh", default="", help="data,fsdp,tensor (default: all devices on data)")
    ap.add_argument("--real", action="store_true",
                    help="the default run's learner step at its real lengths (see above)")
    ap.add_argument("--modes", default=",".join(REAL_MODES), help="--real: modes to time")
    ap.add_argument("--prompt_len", type=int, default=480, help="--real: mean prompt tokens")
    ap.add_argument("--response_len", type=int, default=265, help="--real: mean response tokens")
    args = ap.parse_args()
    mesh = shd.make_mesh(*map(int, args.mesh.split(","))) if args.mesh else shd.make_mesh()
    if args.real:
        bench_real(args, mesh)
        return
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
