"""Benchmark our jitted KV-cache sampler against transformers' `generate` on the same weights.

    .venv/bin/python scripts/bench_sampler.py                 # 0.5B and tiny shapes, batch 1, 8
    .venv/bin/python scripts/bench_sampler.py --shapes tiny --batches 1,8,32

Random float32 weights (bf16 is slow on CPUs without bf16 units), greedy decoding in both, a
short random prompt, a fixed number of new tokens (no early stop). Compilation and the first
transformers call are warm-ups, not timed. Also measures memory bandwidth in the same run and
prints the batch-1 bound: bandwidth / bytes of parameters read per token (only for models too
big for the caches; the tiny one is compute/overhead bound).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
import torch
import transformers

from rl4mle_jax.models import get_preset, load_hf_checkpoint
from rl4mle_jax.sampling import Sampler

SHAPES = {"0.5b": "qwen2.5-0.5b", "tiny": "tiny"}


def measure_bandwidth_gbs(n_bytes: int = 1 << 29, repeats: int = 5) -> float:
    """Memory read bandwidth (GB/s): the fastest of several ways to stream a 512 MiB float32
    array once — numpy sums on one thread and split over all cores (numpy releases the GIL in
    reductions), and XLA's [1, k] x [k, n] product, the shape of a batch-1 decode's matmuls.
    Each reads the array once and does ~1 FLOP per 4 bytes, so the fastest is the least
    compute-bound; a reduction alone can read 24-34 GB/s on this 2-core machine while the XLA
    product reaches ~37, and a bound taken from the slower one understates what a decode can
    reach (so a decode's fraction of it reads too high)."""
    a = np.ones(n_bytes // 4, np.float32)
    parts = np.array_split(a, os.cpu_count() or 1)
    mat = jax.device_put(a.reshape(1024, -1))
    row = jax.numpy.ones((1, 1024), np.float32)
    vecmat = jax.jit(lambda r, m: r @ m)
    jax.block_until_ready(vecmat(row, mat))
    best = np.inf
    with ThreadPoolExecutor(len(parts)) as pool:
        for _ in range(repeats):
            for fn in (a.sum, lambda: list(pool.map(np.sum, parts)),
                       lambda: jax.block_until_ready(vecmat(row, mat))):
                t = time.perf_counter()
                fn()
                best = min(best, time.perf_counter() - t)
    return n_bytes / best / 1e9


def hf_model(preset: str, out_dir: str) -> transformers.Qwen2ForCausalLM:
    c = get_preset(preset)
    cfg = transformers.Qwen2Config(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size, num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
        max_position_embeddings=c.max_position_embeddings, rope_theta=c.rope_theta,
        rms_norm_eps=c.rms_norm_eps, tie_word_embeddings=c.tie_word_embeddings,
        bos_token_id=None, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(cfg).float().eval()
    model.save_pretrained(out_dir)
    return model


def time_hf(model, prompts: np.ndarray, new: int, repeats: int) -> float:
    """Best wall time of `repeats` generate calls (the machine is shared: best-of cuts noise)."""
    ids = torch.from_numpy(prompts).long()
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0,
              eos_token_id=None)
    best = np.inf
    with torch.no_grad():
        model.generate(ids, max_new_tokens=2, min_new_tokens=2, **kw)  # warm-up
        for _ in range(repeats):
            t = time.perf_counter()
            out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, **kw)
            best = min(best, time.perf_counter() - t)
    assert out.shape[1] == prompts.shape[1] + new
    return best


def time_ours(sampler: Sampler, params, prompts: np.ndarray, new: int,
              repeats: int) -> tuple[float, int]:
    rows = [list(map(int, r)) for r in prompts]
    key = jax.random.key(0)
    sampler.generate(params, rows, key, max_new_tokens=new, greedy=True)  # compile
    best = np.inf
    for _ in range(repeats):
        t = time.perf_counter()
        out = sampler.generate(params, rows, key, max_new_tokens=new, greedy=True)
        best = min(best, time.perf_counter() - t)
    return best, int(out.lengths.sum())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="0.5b,tiny", help=f"comma list of {sorted(SHAPES)}")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--prompt_len", type=int, default=16)
    ap.add_argument("--new_tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2, help="timed calls per cell (best kept)")
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    batches = [int(b) for b in args.batches.split(",")]
    bw = measure_bandwidth_gbs()
    print(f"jax {jax.__version__} ({jax.default_backend()}), torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {os.cpu_count()} CPUs; "
          f"memory read bandwidth {bw:.1f} GB/s (numpy sum; re-measured per shape, best kept)")
    rows = []
    for shape in args.shapes.split(","):
        with tempfile.TemporaryDirectory() as d:
            model = hf_model(SHAPES[shape], d)
            config, params = load_hf_checkpoint(d)
        n_params = sum(x.size for x in jax.tree.leaves(params))
        bw = max(bw, measure_bandwidth_gbs())  # bandwidth drifts with the neighbours' load
        bound = bw * 1e9 / (4 * n_params)  # batch 1 reads every float32 weight once per token
        vocab_stop = config.vocab_size - 1  # random weights: any stop id is only a formality
        sampler = Sampler(config, [vocab_stop], pad_id=0, prompt_buckets=(args.prompt_len,),
                          batch_buckets=tuple(batches), new_token_buckets=(args.new_tokens,))
        rng = np.random.default_rng(0)
        for b in batches:
            prompts = rng.integers(1, config.vocab_size - 1, (b, args.prompt_len))
            t_hf = time_hf(model, prompts, args.new_tokens, args.repeats)
            t_ours, n_tok = time_ours(sampler, params, prompts, args.new_tokens, args.repeats)
            hf_tps, ours_tps = b * args.new_tokens / t_hf, n_tok / t_ours
            rows.append((shape, f"{n_params / 1e6:.1f}M", b, hf_tps, ours_tps, ours_tps / hf_tps,
                         bound if b == 1 and 4 * n_params > (64 << 20) else None))
            print(f"  {shape} batch {b}: transformers {hf_tps:.1f} tok/s, ours {ours_tps:.1f} "
                  f"tok/s", flush=True)
        del model, params
    print(f"\nbest memory read bandwidth seen: {bw:.1f} GB/s; load average {os.getloadavg()}")
    print("| shape | params | batch | transformers tok/s | ours tok/s | ratio | "
          "bandwidth bound tok/s |")
    print("|---|---|---|---|---|---|---|")
    for shape, n, b, hf_tps, ours_tps, ratio, bnd in rows:
        bnd_s = f"{bnd:.1f} (ours at {100 * ours_tps / bnd:.0f}%)" if bnd else "-"
        print(f"| {shape} | {n} | {b} | {hf_tps:.1f} | {ours_tps:.1f} | {ratio:.2f}x | {bnd_s} |")


if __name__ == "__main__":
    main()
