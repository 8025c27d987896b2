"""After tuning: sample the solve prompt and run the answers (the paper's filter statistic),
and ask the model to instrument programs (the LM instrumenter's accept rate)."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from rl4mle_jax.env.actions import extract_action
from rl4mle_jax.env.instrument_lm import lm_instrument_prompt, verify_lm_instrumentation
from rl4mle_jax.env.metrics import oriented_score
from rl4mle_jax.models import Qwen2Config
from rl4mle_jax.models.tokenizer import Tokenizer
from rl4mle_jax.sampling import Sampler
from rl4mle_jax.warmstart.demo_runs import run_demos
from rl4mle_jax.warmstart.demos import DemoProgram
from rl4mle_jax.warmstart.sft import bucket_len

Params = Any


def sample_and_run(config: Qwen2Config, params: Params, tokenizer: Tokenizer, task,
                   prompt: str, n: int, temperature: float, max_new_tokens: int, sandbox,
                   rng: jax.Array, workers: int = 2, timeout_s: float | None = None) -> dict:
    """Samples `n` answers to `prompt`, runs the runnable ones; the paper's filter statistic."""
    ids = tokenizer.encode(prompt)
    sampler = Sampler(config, tokenizer.stop_token_ids, tokenizer.pad_id,
                      prompt_buckets=(bucket_len(len(ids), 128),), max_new_tokens=max_new_tokens)
    t0 = time.time()
    out = sampler.generate(params, [ids] * n, rng, temperature=temperature)
    sample_s = time.time() - t0
    texts = [tokenizer.decode(out.tokens[i, : out.lengths[i]], skip_special_tokens=True)
             for i in range(n)]
    actions = [extract_action(t) for t in texts]
    runnable = [DemoProgram(a.plan, a.code, "sample", {}) for a in actions if a.ok]
    t0 = time.time()
    runs = run_demos(task, runnable, sandbox, workers=workers, timeout_s=timeout_s)
    valid = [r for r in runs if r.valid]
    failures: dict[str, int] = {}
    for a in actions:
        if not a.ok:
            failures[a.failure] = failures.get(a.failure, 0) + 1
    for r in runs:
        if not r.valid:
            key = (r.reason or r.status).split(":")[0]
            failures[key] = failures.get(key, 0) + 1
    scores = [r.score for r in valid]
    return {
        "task_id": task.id, "n": n, "temperature": temperature,
        "parse_ok": len(runnable) / n, "valid_rate": len(valid) / n,
        "stopped_rate": float(np.mean(out.stopped)), "mean_length": float(np.mean(out.lengths)),
        "scores": scores,
        "best_score": max(scores, key=lambda s: oriented_score(s, task.direction))
        if scores else None,
        "mean_duration_s": float(np.mean([r.duration_s for r in runs])) if runs else None,
        "families": sorted({f for r in valid for f in _families_in(r.code)}),
        "failures": failures, "sample_s": sample_s, "run_s": time.time() - t0,
        "example": texts[0][:1500],
    }


def _families_in(code: str) -> list[str]:
    return re.findall(r"\b([A-Z]\w*(?:Classifier|Regressor|Regression|NB|Bayes))\(", code)[:1]


def instrument_accept_rate(config: Qwen2Config, params: Params, tokenizer: Tokenizer,
                           codes: Sequence[str], max_new_tokens: int, rng: jax.Array) -> dict:
    """Greedy LM instrumentation of `codes` by the tuned model, checked by the real verifier."""
    prompts_ids = [tokenizer.encode(lm_instrument_prompt(c)) for c in codes]
    sampler = Sampler(config, tokenizer.stop_token_ids, tokenizer.pad_id,
                      prompt_buckets=(bucket_len(max(map(len, prompts_ids)), 128),),
                      max_new_tokens=max_new_tokens)
    out = sampler.generate(params, prompts_ids, rng, greedy=True)
    reasons: dict[str, int] = {}
    for i, code in enumerate(codes):
        text = tokenizer.decode(out.tokens[i, : out.lengths[i]], skip_special_tokens=True)
        _, rec = verify_lm_instrumentation(code, text)
        key = "accepted" if rec["accepted"] else rec["reason"]
        reasons[key] = reasons.get(key, 0) + 1
    return {"n": len(codes), "accept_rate": reasons.get("accepted", 0) / max(len(codes), 1),
            "outcomes": reasons}


def spread_over_builds(rates: Sequence[float], n: int) -> dict:
    """Valid shares of several builds, each from `n` independent draws: their mean, their std
    over builds (ddof 1), the std that `n` binomial draws alone give around those shares
    (sqrt(mean p(1 - p) / n)), the between-build std left once that is taken out
    (sqrt(max(sd^2 - sampling^2, 0))), and the worst and best build."""
    p = np.asarray(rates, float)
    sd = float(p.std(ddof=1)) if len(p) > 1 else float("nan")
    sampling = float(np.sqrt(np.mean(p * (1 - p)) / n))
    build = float(np.sqrt(max(sd ** 2 - sampling ** 2, 0.0))) if len(p) > 1 else float("nan")
    return {"mean": float(p.mean()), "sd": sd, "sampling_sd": sampling, "build_sd": build,
            "min": float(p.min()), "max": float(p.max()), "builds": len(p)}
