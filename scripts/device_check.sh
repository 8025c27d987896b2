#!/usr/bin/env bash
# One table of what an accelerator gives us: engine decode tokens/s at batch 1/8/64 and PPO
# train-step time and MFU, at the Qwen2.5-0.5B and 3B shapes (random weights, bfloat16).
#
#     scripts/device_check.sh              # on a GPU: about 8 minutes; on a CPU: tiny, seconds
#     scripts/device_check.sh --cpu_shapes # force the tiny CPU variant anywhere (CI)
#     BUDGET_S=300 scripts/device_check.sh # rows not started by then print "skipped" (420 s)
#
# Downloads nothing and needs only jax, flax, optax and numpy (safetensors, which
# rl4mle_jax.models imports for checkpoint files, is stubbed if it is missing: no file is
# read here). Each row is measured alone; a row that fails prints its error and the rest go
# on, so one out-of-memory does not lose the table. MFU is against the bfloat16 matmul rate
# measured in the same run and, where the device is known, its nominal dense peak; a decode
# row's bandwidth is the bytes a step must read (weights, whole KV cache) times steps/s, over the
# copy bandwidth measured in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
exec "$PY" - "$@" <<'PYEOF'
import importlib.util
import os
import sys
import time
import types

if importlib.util.find_spec("safetensors") is None:  # see the header: no file is read
    for name in ("safetensors", "safetensors.numpy"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules["safetensors"].safe_open = sys.modules["safetensors.numpy"].save_file = None

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, ".")
sys.path.insert(0, "scripts")
from bench_train_step import make_batch, step_flops  # noqa: E402

from rl4mle_jax import models  # noqa: E402
from rl4mle_jax import sharding as shd  # noqa: E402
from rl4mle_jax.engine import Engine  # noqa: E402
from rl4mle_jax.rl.learner import make_learner  # noqa: E402
from rl4mle_jax.rl.learner_config import LearnerConfig  # noqa: E402

BUDGET_S = float(os.environ.get("BUDGET_S", 420))  # compiles dominate: 3B ones are slow
NOMINAL_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L4": 121e12}
cpu = jax.default_backend() == "cpu" or "--cpu_shapes" in sys.argv
if cpu:  # tiny shapes so that CI checks in seconds that the script still runs
    SHAPES = {"tiny": models.get_preset("tiny", vocab_size=512, num_hidden_layers=2)}
    PROMPT, NEW, TRAIN_BATCH, TRAIN_SEQ, MM, COPY_MB = 16, 16, 2, 64, 256, 64
else:
    SHAPES = {s: models.get_preset(f"qwen2.5-{s}") for s in ("0.5b", "3b")}
    PROMPT, NEW, TRAIN_BATCH, TRAIN_SEQ, MM, COPY_MB = 128, 128, 8, 1024, 8192, 4096
SHAPES = {k: c.replace(dtype="bfloat16", param_dtype="bfloat16") for k, c in SHAPES.items()}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def best_time(fn, *args):
    """Least wall-clock seconds of 5 calls of jitted `fn` after one warm-up call."""
    fn(*args).block_until_ready()
    best = np.inf
    for _ in range(5):
        t = time.perf_counter()
        fn(*args).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return best


def matmul_peak():
    a = jnp.ones((MM, MM), jnp.bfloat16)
    return 2 * MM**3 / best_time(jax.jit(jnp.dot), a, a)


def copy_bandwidth():
    """Bytes/s of a jitted `x + 1` over COPY_MB of bfloat16 (read and write counted), best of
    5: the memory-bandwidth bound that decode rows are set against."""
    x = jnp.ones((COPY_MB << 19,), jnp.bfloat16)
    return 2 * x.nbytes / best_time(jax.jit(lambda a: a + 1), x)


def step_bytes(config, params, slots):
    """Bytes one decode step reads: every weight once (a tied embedding once, as the output
    projection; an untied input embedding is counted whole though a step reads one row of it,
    so untied shapes are overstated) and every slot's whole key/value cache (attention reads
    all prompt + new rows of it, masked). Qwen2.5-0.5B and 3B tie their embeddings."""
    weights = sum(leaf.nbytes for leaf in jax.tree.leaves(params))
    kv = (2 * config.num_hidden_layers * slots * (PROMPT + NEW) * config.num_key_value_heads
          * config.head_dim * jnp.dtype(config.dtype).itemsize)
    return weights + kv


def engine_tps(config, params, slots):
    """Decode tokens/s with every slot busy (the first step, holding the prefills, untimed)."""
    engine = Engine(config, [config.vocab_size], 0, num_slots=slots, prompt_buckets=(PROMPT,),
                    max_new_tokens=NEW)
    t = time.perf_counter()
    engine.warmup(params)
    compile_s = time.perf_counter() - t
    rng = np.random.default_rng(0)
    for i in range(slots):
        engine.submit(rng.integers(0, config.vocab_size, PROMPT).tolist(), jax.random.key(i))
    engine.step(params)
    t = time.perf_counter()
    engine.run(params)
    return slots * (NEW - 1) / (time.perf_counter() - t), compile_s


def train_step(config, mesh):
    lc = LearnerConfig(remat=not cpu)
    learner = make_learner(config, lc, mesh)
    params = models.init_params(config, jax.random.PRNGKey(0))
    state = learner.init_state(learner.shard_params(params), jax.random.PRNGKey(1))
    del params
    batch = jax.device_put(learner.prepare_batch(make_batch(config, TRAIN_BATCH, TRAIN_SEQ)),
                           learner.batch_sharding)
    t = time.perf_counter()
    state, metrics = learner.train_step_jit(state, batch)
    jax.block_until_ready(metrics)
    compile_s = time.perf_counter() - t
    times = []
    for _ in range(3):
        t = time.perf_counter()
        state, metrics = learner.train_step_jit(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - t)
    return float(np.median(times)), compile_s


def main():
    dev = jax.devices()[0]
    kind = getattr(dev, "device_kind", dev.platform)
    nominal = next((v for k, v in NOMINAL_BF16.items() if k in kind), None)
    peak, bandwidth = matmul_peak(), copy_bandwidth()
    log(f"jax {jax.__version__}, {len(jax.devices())} x {kind}; bf16 matmul {MM}^2: "
        f"{peak / 1e12:.1f} TFLOP/s; copy {bandwidth / 1e9:.0f} GB/s")
    mesh = shd.make_mesh()
    rows = []
    t0 = time.perf_counter()

    def skip(name, what):
        if time.perf_counter() - t0 < BUDGET_S:
            return False
        rows.append((name, what, f"skipped: past the {BUDGET_S:.0f} s budget", "-", "-"))
        return True

    for name, config in SHAPES.items():  # the smaller shape first: its rows come back surely
        params = models.init_params(config, jax.random.PRNGKey(0))
        for slots in (1, 8, 64):
            if skip(name, f"engine decode, batch {slots}"):
                continue
            try:
                tps, c_s = engine_tps(config, params, slots)
                used = tps / slots * step_bytes(config, params, slots) / bandwidth
                rows.append((name, f"engine decode, batch {slots}", f"{tps:.1f} tok/s",
                             f"{used:.0%} of copy bandwidth", f"{c_s:.0f}"))
            except Exception as e:  # a failed row is reported, not fatal
                rows.append((name, f"engine decode, batch {slots}", f"error: {e!r:.80}", "-",
                             "-"))
            log(f"  {rows[-1]}")
        del params
        if skip(name, "train step"):
            continue
        try:
            step_s, c_s = train_step(config, mesh)
            flops = step_flops(config, TRAIN_BATCH, TRAIN_SEQ)
            mfu = f"{flops / step_s / peak:.1%} of measured"
            if nominal:
                mfu += f", {flops / step_s / nominal:.1%} of nominal"
            rows.append((name, f"train step, {TRAIN_BATCH} x {TRAIN_SEQ} tokens",
                         f"{step_s:.3f} s", mfu, f"{c_s:.0f}"))
        except Exception as e:
            rows.append((name, "train step", f"error: {e!r:.80}", "-", "-"))
        log(f"  {rows[-1]}")
    print(f"device: {len(jax.devices())} x {kind} ({jax.default_backend()}), jax "
          f"{jax.__version__}; bf16 matmul peak measured {peak / 1e12:.2f} TFLOP/s"
          + (f", nominal {nominal / 1e12:.0f}" if nominal else "")
          + f"; copy bandwidth measured {bandwidth / 1e9:.0f} GB/s")
    print(f"engine: prompt {PROMPT}, {NEW} new tokens per request, all slots busy")
    print("| shape | what | result | MFU (train) / bandwidth used (decode) | compile s |")
    print("|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


main()
PYEOF
