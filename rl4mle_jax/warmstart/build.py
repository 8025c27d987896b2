"""Warm start of the embedded default: a tiny Qwen2 fine-tuned on demonstrations, cached.

The paper starts RL from a model that already writes some valid solutions. On a laptop CPU we
get one in a few minutes: run varied real demonstration programs on the task's reward split
(`env.demos`), train a byte-level BPE on them (plus the prompts and a local code corpus), and
fine-tune the tiny model on (solve prompt -> plan + fenced code) and (instrumentation prompt ->
instrumented program) pairs, loss on response tokens only. The result is saved as a Hugging
Face directory, so it loads through `load_hf_checkpoint` / `load_tokenizer` exactly like a real
Qwen checkpoint, and is cached by a hash of (task ids, config, demo-set version). After
training we sample the solve prompt at temperature 0.7 and run the samples in the sandbox: the
fraction with a valid submission is the paper's filter, reported in `stats`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rl4mle_jax.env import demos as demos_lib
from rl4mle_jax.models import (
    Qwen2Config,
    forward,
    get_preset,
    init_cache,
    init_params,
    load_hf_checkpoint,
    positions_from_mask,
    save_hf_checkpoint,
)
from rl4mle_jax.models.tokenizer import (
    Tokenizer,
    build_code_corpus,
    load_tokenizer,
    train_bpe_tokenizer,
)
from rl4mle_jax.warmstart.config import WarmStartConfig, default_warmstart_dir  # noqa: F401

WARMSTART_VERSION = "1"
Params = Any


@dataclasses.dataclass
class WarmStart:
    """A warm-started policy: config + params, and the HF directory they were saved to."""

    model_config: Qwen2Config
    params: Params
    hf_dir: Path  # config.json, model.safetensors, tokenizer files
    demos: list  # list[demos_lib.Demo]
    stats: dict
    cached: bool = False

    @property
    def tokenizer_dir(self) -> Path:
        return self.hf_dir


# ----------------------------------------------------------------------------- cache


def cache_key(task_ids: Sequence[str], config: WarmStartConfig, extra: Mapping | None = None
              ) -> str:
    """Hash of everything the warm start depends on (tasks, config, demo generator, prompts)."""
    blob = json.dumps({"tasks": list(task_ids), "config": dataclasses.asdict(config),
                       "demo_set": demos_lib.DEMO_SET_VERSION, "version": WARMSTART_VERSION,
                       "extra": extra or {}}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load_warmstart(path: str | os.PathLike) -> WarmStart:
    """Load a finished warm-start directory (the one `build_warmstart` returns)."""
    path = Path(path)
    if not (path / "DONE").exists():
        raise FileNotFoundError(f"{path} is not a finished warm start (no DONE file)")
    config, params = load_hf_checkpoint(path / "hf")
    stats = json.loads((path / "stats.json").read_text())
    return WarmStart(config, params, path / "hf", demos_lib.load_demos(path / "demos.jsonl"),
                     stats, cached=True)


# ----------------------------------------------------------------------------- SFT data


@dataclasses.dataclass(frozen=True)
class SFTExample:
    """Token ids of one (prompt, response) pair; the response ends with the eos id."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    kind: str  # "solve" | "improve" | "instrument"

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


def encode_pairs(tokenizer: Tokenizer, pairs: Sequence[tuple[str, str, str]],
                 max_prompt: int, max_response: int, max_total: int
                 ) -> tuple[list[SFTExample], dict[str, int]]:
    """Encodes (prompt, response, kind) triples; over-long ones are dropped and counted."""
    out, dropped = [], {"prompt_too_long": 0, "response_too_long": 0, "total_too_long": 0}
    eos = tokenizer.eos_id
    for prompt, response, kind in pairs:
        p = tokenizer.encode(prompt)
        r = tokenizer.encode(response) + [eos]
        if kind != "instrument" and len(p) > max_prompt:
            dropped["prompt_too_long"] += 1
        elif kind != "instrument" and len(r) > max_response:
            dropped["response_too_long"] += 1
        elif len(p) + len(r) > max_total:
            dropped["total_too_long"] += 1
        else:
            out.append(SFTExample(tuple(p), tuple(r), kind))
    return out, dropped


def make_batch(examples: Sequence[SFTExample], prompt_len: int, response_len: int, pad_id: int,
               shared_prompt: bool = False) -> dict[str, np.ndarray]:
    """prompt/prompt_mask [B, P] left-padded (as the sampler pads); response/response_mask
    [B, R] right-padded. shared_prompt: all examples have the same prompt, stored once [1, P]."""
    b = len(examples)
    if shared_prompt and len({ex.prompt_ids for ex in examples}) != 1:
        raise ValueError("shared_prompt=True but the examples have different prompts")
    bp = 1 if shared_prompt else b
    prompt = np.full((bp, prompt_len), pad_id, np.int32)
    pmask = np.zeros((bp, prompt_len), np.int32)
    resp = np.full((b, response_len), pad_id, np.int32)
    rmask = np.zeros((b, response_len), np.float32)
    for i, ex in enumerate(examples):
        p, r = len(ex.prompt_ids), len(ex.response_ids)
        if p > prompt_len or r > response_len or p < 1:
            raise ValueError(f"example {i} has {p} prompt / {r} response tokens; the batch "
                             f"holds 1..{prompt_len} / {response_len}")
        if i < bp:
            prompt[i, prompt_len - p:] = ex.prompt_ids
            pmask[i, prompt_len - p:] = 1
        resp[i, :r] = ex.response_ids
        rmask[i, :r] = 1.0
    return {"prompt": prompt, "prompt_mask": pmask, "response": resp, "response_mask": rmask}


def sft_loss(config: Qwen2Config, params: Params, batch: Mapping[str, jax.Array]) -> jax.Array:
    """Mean negative log-likelihood of the response tokens given the prompt.

    The prompt (all but its last token) is encoded once into a KV cache without gradient, the
    way the sampler prefills it; the response block then runs with gradient. The value equals
    the full-sequence loss; skipping the prompt's backward pass makes a step ~1.7x cheaper.
    """
    prompt_bp, pmask_bp = batch["prompt"], batch["prompt_mask"]
    resp_br, rmask_br = batch["response"], batch["response_mask"]
    bp, p = prompt_bp.shape
    b, r = resp_br.shape
    cache = init_cache(config, bp, p - 1 + r)
    pos_bp = positions_from_mask(pmask_bp)
    _, cache = forward(config, params, prompt_bp[:, :-1], pos_bp[:, :-1], pmask_bp[:, :-1],
                       cache=cache, cache_index=0)
    cache = jax.lax.stop_gradient(cache)
    if bp != b:  # one shared prompt: encode it once, give every response a copy of its cache
        cache = jax.tree.map(lambda x: jnp.broadcast_to(x, (b,) + x.shape[1:]), cache)
        prompt_bp, pmask_bp = (jnp.broadcast_to(x, (b, p)) for x in (prompt_bp, pmask_bp))
    # Inputs: the prompt's last token, then the response shifted right; targets: the response.
    inputs_br = jnp.concatenate([prompt_bp[:, -1:], resp_br[:, :-1]], axis=1)
    in_mask_br = jnp.concatenate([jnp.ones((b, 1), jnp.int32),
                                  rmask_br[:, :-1].astype(jnp.int32)], axis=1)
    pos_br = jnp.sum(pmask_bp, axis=1, keepdims=True) - 1 + jnp.arange(r)[None, :]
    logits_brv, _ = forward(config, params, inputs_br, pos_br, in_mask_br, cache=cache,
                            cache_index=p - 1)
    logp_brv = jax.nn.log_softmax(logits_brv, axis=-1)
    nll_br = -jnp.take_along_axis(logp_brv, resp_br[..., None], axis=-1)[..., 0]
    return jnp.sum(nll_br * rmask_br) / jnp.maximum(jnp.sum(rmask_br), 1.0)


def make_train_step(config: Qwen2Config, optimizer: optax.GradientTransformation):
    """Jitted (params, opt_state, batch) -> (params, opt_state, loss)."""

    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(lambda p: sft_loss(config, p, batch))(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(step, donate_argnums=(0, 1))


def _bucket_len(n: int, quantum: int = 128) -> int:
    return int(math.ceil(n / quantum) * quantum)


def train_sft(config: Qwen2Config, params: Params, examples: Sequence[SFTExample], pad_id: int,
              cfg: WarmStartConfig, log: Callable[[str], None] = lambda s: None
              ) -> tuple[Params, dict]:
    """Fine-tunes `params` on `examples` for `cfg.steps` AdamW steps; returns (params, stats).

    Examples are grouped by (prompt, response) length buckets (multiples of 128 / 64 tokens) so
    each bucket compiles once; every step draws one bucket (in proportion to its size) and a
    batch from it.
    """
    if not examples:
        raise ValueError("no SFT examples (no valid demonstration fits the token limits)")
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, cfg.learning_rate, max(1, min(cfg.warmup_steps, cfg.steps - 1)), max(cfg.steps, 2),
        cfg.learning_rate * 0.1)
    optimizer = optax.chain(optax.clip_by_global_norm(1.0),
                            optax.adamw(schedule, b2=0.98, weight_decay=cfg.weight_decay))
    opt_state = optimizer.init(params)
    step_fn = make_train_step(config, optimizer)
    # Bucket by (prompt length, response length, shared prompt): the solve examples of a task
    # share their prompt, so their batches encode it once.
    by_prompt: dict[tuple[int, ...], int] = {}
    for ex in examples:
        by_prompt[ex.prompt_ids] = by_prompt.get(ex.prompt_ids, 0) + 1
    buckets: dict[tuple, list[SFTExample]] = {}
    for ex in examples:
        shared = ex.prompt_ids if by_prompt[ex.prompt_ids] >= cfg.batch_size else ()
        key = (_bucket_len(len(ex.prompt_ids)), _bucket_len(len(ex.response_ids), 64), shared)
        buckets.setdefault(key, []).append(ex)
    keys = sorted(buckets)
    probs = np.array([len(buckets[k]) for k in keys], float)
    probs /= probs.sum()
    rng = np.random.default_rng(cfg.seed)
    losses, tokens_seen, t0, c0 = [], 0, time.time(), time.process_time()
    first_step_s = 0.0
    for i in range(cfg.steps):
        key = keys[rng.choice(len(keys), p=probs)]
        pool = buckets[key]
        idx = rng.choice(len(pool), size=cfg.batch_size, replace=len(pool) < cfg.batch_size)
        batch = make_batch([pool[j] for j in idx], key[0], key[1], pad_id, bool(key[2]))
        tokens_seen += int(batch["prompt_mask"].sum() + batch["response_mask"].sum())
        params, opt_state, loss = step_fn(params, opt_state, batch)
        losses.append(float(loss))
        if i == 0:
            first_step_s = time.time() - t0  # mostly compilation
        if i % 10 == 0 or i == cfg.steps - 1:
            log(f"warm start: step {i + 1}/{cfg.steps} loss {losses[-1]:.3f} "
                f"({time.time() - t0:.0f}s)")
    wall = time.time() - t0
    k = max(1, len(losses) // 10)
    stats = {"steps": cfg.steps, "loss_first": losses[0], "loss_last": losses[-1],
             "loss_first10_mean": float(np.mean(losses[:k])),
             "loss_last10_mean": float(np.mean(losses[-k:])),
             "loss_curve": [round(x, 4) for x in losses[:: max(1, len(losses) // 20)]],
             "train_s": wall, "cpu_s": time.process_time() - c0, "first_step_s": first_step_s,
             "tokens": tokens_seen, "tokens_per_s": tokens_seen / wall,
             "buckets": {f"{p}+{r}{'/shared' if sh else ''}": len(buckets[p, r, sh])
                         for p, r, sh in keys}}
    return params, stats


# ----------------------------------------------------------------------------- pairs


def solve_prompt(task, libraries: Sequence[str], prompt_config, count_tokens,
                 split: str = "reward") -> str:
    """The plain-text (non-chat) solve prompt the tiny model is tuned on and sampled with."""
    from rl4mle_jax.env import prompts

    ctx = prompts.task_context(task, tuple(libraries), split, prompt_config)
    return prompts.build_prompt(ctx, cfg=prompt_config, chat_template=None,
                                count_tokens=count_tokens).text


def training_pairs(task, demos: Sequence[demos_lib.Demo], libraries: Sequence[str],
                   prompt_config, count_tokens, cfg: WarmStartConfig
                   ) -> list[tuple[str, str, str]]:
    """(prompt, response, kind) for one task: every valid demo after the solve prompt of both
    splits; improve prompts (an earlier demo and its outcome -> a better valid demo); and
    instrumentation pairs (LM instrumenter prompt -> the program with milestone prints)."""
    from rl4mle_jax.env import prompts

    valid = sorted((d for d in demos if d.valid), key=lambda d: -d.reward)
    pairs = []
    for split in ("reward", "test"):
        text = solve_prompt(task, libraries, prompt_config, count_tokens, split)
        pairs += [(text, d.response(), "solve") for d in valid]
    ctx = prompts.task_context(task, tuple(libraries), "reward", prompt_config)
    rng = np.random.default_rng(cfg.seed)
    for _ in range(cfg.improve_pairs_per_task if valid else 0):
        before = demos[int(rng.integers(len(demos)))]
        better = [d for d in valid if not before.valid or d.reward > before.reward]
        after = better[int(rng.integers(len(better)))] if better else valid[0]
        text = prompts.build_prompt(ctx, earlier_code=before.code, outcome=before.outcome,
                                    cfg=prompt_config, chat_template=None,
                                    count_tokens=count_tokens).text
        pairs.append((text, after.response(), "improve"))
    codes = [d.code for d in valid[: cfg.instrument_pairs_per_task]]
    pairs += [(p, r, "instrument") for p, r in demos_lib.instrumentation_pairs(codes)]
    return pairs


# ----------------------------------------------------------------------------- evaluation


def sample_and_run(config: Qwen2Config, params: Params, tokenizer: Tokenizer, task,
                   prompt: str, n: int, temperature: float, max_new_tokens: int, sandbox,
                   rng: jax.Array, workers: int = 2, timeout_s: float | None = None) -> dict:
    """Samples `n` answers to `prompt`, runs the runnable ones; the paper's filter statistic."""
    from rl4mle_jax.env.actions import extract_action
    from rl4mle_jax.sampling import Sampler

    ids = tokenizer.encode(prompt)
    sampler = Sampler(config, tokenizer.stop_token_ids, tokenizer.pad_id,
                      prompt_buckets=(_bucket_len(len(ids), 128),), max_new_tokens=max_new_tokens)
    t0 = time.time()
    out = sampler.generate(params, [ids] * n, rng, temperature=temperature)
    sample_s = time.time() - t0
    texts = [tokenizer.decode(out.tokens[i, : out.lengths[i]], skip_special_tokens=True)
             for i in range(n)]
    actions = [extract_action(t) for t in texts]
    runnable = [demos_lib.DemoProgram(a.plan, a.code, "sample", {}) for a in actions if a.ok]
    t0 = time.time()
    runs = demos_lib.run_programs(task, runnable, sandbox, workers=workers, timeout_s=timeout_s)
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
        "scores": scores, "best_score": (max(scores) if task.direction == "higher"
                                         else min(scores)) if scores else None,
        "mean_duration_s": float(np.mean([r.duration_s for r in runs])) if runs else None,
        "families": sorted({f for r in valid for f in _families_in(r.code)}),
        "failures": failures, "sample_s": sample_s, "run_s": time.time() - t0,
        "example": texts[0][:1500],
    }


def _families_in(code: str) -> list[str]:
    import re

    return re.findall(r"\b([A-Z]\w*(?:Classifier|Regressor|Regression|NB|Bayes))\(", code)[:1]


def instrument_accept_rate(config: Qwen2Config, params: Params, tokenizer: Tokenizer,
                           codes: Sequence[str], max_new_tokens: int, rng: jax.Array) -> dict:
    """Greedy LM instrumentation of `codes` by the tuned model, checked by the real verifier."""
    from rl4mle_jax.env.instrument_lm import lm_instrument_prompt, verify_lm_instrumentation
    from rl4mle_jax.sampling import Sampler

    prompts_ids = [tokenizer.encode(lm_instrument_prompt(c)) for c in codes]
    sampler = Sampler(config, tokenizer.stop_token_ids, tokenizer.pad_id,
                      prompt_buckets=(_bucket_len(max(map(len, prompts_ids)), 128),),
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


# ----------------------------------------------------------------------------- build


def make_sandbox(cfg: WarmStartConfig):
    from rl4mle_jax.env.sandbox import Sandbox

    if cfg.sandbox_backend == "auto":
        return demos_lib.default_sandbox(cfg.demo_timeout_s)
    return Sandbox(backend=cfg.sandbox_backend, timeout_s=cfg.demo_timeout_s, cpus=1)


def task_demos(task, cfg: WarmStartConfig, sandbox, cache_dir: Path,
               log: Callable[[str], None] = lambda s: None) -> list[demos_lib.Demo]:
    """The task's demonstrations, run once and cached (keyed by data, generator and config)."""
    key = hashlib.sha256(json.dumps(
        [task.id, task.extra.get("data_sha256"), demos_lib.DEMO_SET_VERSION, cfg.demos_per_task,
         cfg.demo_seed, cfg.demo_timeout_s]).encode()).hexdigest()[:16]
    path = cache_dir / f"{task.id}-{key}.jsonl"
    if path.exists():
        return demos_lib.load_demos(path)
    t0 = time.time()
    demos = demos_lib.make_demos(task, n=cfg.demos_per_task, seed=cfg.demo_seed,
                                 sandbox=sandbox, workers=cfg.workers,
                                 timeout_s=cfg.demo_timeout_s)
    log(f"warm start: ran {len(demos)} demos for {task.id} in {time.time() - t0:.0f}s "
        f"({sum(d.valid for d in demos)} valid)")
    demos_lib.save_demos(path, demos)
    return demos


def build_warmstart(task_ids: Sequence[str], out_dir: str | os.PathLike,
                    config: WarmStartConfig | Mapping[str, Any] | None = None, *,
                    prompt_config=None, libraries: Sequence[str] | None = None, sandbox=None,
                    data_root: str | os.PathLike | None = None,
                    log: Callable[[str], None] = print, force: bool = False) -> WarmStart:
    """Builds (or loads from `out_dir`'s cache) the warm-started tiny model for `task_ids`.

    prompt_config: the `env.prompts.PromptConfig` the RL loop renders prompts with (default:
      no system prompt, cfg.max_prompt_tokens / cfg.max_response_tokens). libraries: what the
      prompts list as installed (default: probed inside the sandbox, as the loop should).
    """
    from rl4mle_jax.env import prompts
    from rl4mle_jax.env.tasks import load_task

    cfg = config if isinstance(config, WarmStartConfig) else WarmStartConfig.from_mapping(config)
    t_start = time.time()
    out_dir = Path(out_dir)
    tasks = [load_task(t, data_root) for t in task_ids]
    pcfg = prompt_config or prompts.PromptConfig(
        max_prompt_tokens=cfg.max_prompt_tokens, max_response_tokens=cfg.max_response_tokens,
        system_prompt=None)
    sandbox = sandbox or make_sandbox(cfg)
    if libraries is None:
        libraries = list(prompts.probe_libraries(sandbox, input_dir=tasks[0].input_dir("reward")))
    key = cache_key([t.id for t in tasks], cfg, {
        "prompt": dataclasses.asdict(pcfg), "libraries": list(libraries),
        "data": [t.extra.get("data_sha256") for t in tasks]})
    final = out_dir / f"warmstart-{key}"
    if (final / "DONE").exists() and not force:
        ws = load_warmstart(final)
        log(f"warm start: cached {final} ({time.time() - t_start:.1f}s)")
        return ws
    tmp = out_dir / f".tmp-warmstart-{key}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    hf_dir = tmp / "hf"
    timings: dict[str, float] = {}

    t0 = time.time()
    all_demos = {t.id: task_demos(t, cfg, sandbox, out_dir / "demos", log) for t in tasks}
    timings["demos_s"] = time.time() - t0

    t0 = time.time()
    # Tokenizer corpus: the untrimmed prompts (the real trim needs the real tokenizer).
    wide = dataclasses.replace(pcfg, max_prompt_tokens=1 << 20)
    approx = [training_pairs(t, all_demos[t.id], libraries, wide, prompts.approx_token_count, cfg)
              for t in tasks]
    in_domain = [p + "\n" + r for pairs in approx for p, r, _ in pairs]
    corpus = in_domain * cfg.in_domain_repeats + build_code_corpus(max_bytes=cfg.code_corpus_bytes)
    tokenizer = train_bpe_tokenizer(corpus, cfg.vocab_size, hf_dir, chat_template=None)
    timings["tokenizer_s"] = time.time() - t0

    def count(text: str) -> int:
        return len(tokenizer.encode(text))

    pairs = [p for t in tasks for p in training_pairs(t, all_demos[t.id], libraries, pcfg,
                                                      count, cfg)]
    examples, dropped = encode_pairs(tokenizer, pairs, pcfg.max_prompt_tokens,
                                     pcfg.max_response_tokens, cfg.max_instrument_tokens)
    kinds = {k: sum(e.kind == k for e in examples) for k in ("solve", "improve", "instrument")}
    log(f"warm start: {len(examples)} SFT examples {kinds}, dropped {dropped}")

    vocab = int(math.ceil(tokenizer.vocab_size / 128) * 128)
    model_config = get_preset(cfg.preset, vocab_size=vocab, **dict(cfg.model_overrides))
    rng = jax.random.PRNGKey(cfg.seed)
    params = init_params(model_config, jax.random.fold_in(rng, 0))
    params, sft_stats = train_sft(model_config, params, examples, tokenizer.pad_id, cfg, log)
    timings["sft_s"] = sft_stats["train_s"]

    save_hf_checkpoint(model_config, params, hf_dir)
    (hf_dir / "generation_config.json").write_text(json.dumps({
        "eos_token_id": list(tokenizer.stop_token_ids), "pad_token_id": tokenizer.pad_id,
        "do_sample": True, "temperature": cfg.eval_temperature}, indent=2))
    loaded = load_tokenizer(hf_dir)  # what users of the directory will get
    if loaded.encode(pairs[0][0]) != tokenizer.encode(pairs[0][0]):
        raise RuntimeError(f"tokenizer saved in {hf_dir} does not round-trip")

    t0 = time.time()
    evals, solve_prompts = {}, {}
    for i, t in enumerate(tasks):
        solve_prompts[t.id] = {s: solve_prompt(t, libraries, pcfg, count, s)
                               for s in ("reward", "test")}
        evals[t.id] = sample_and_run(
            model_config, params, tokenizer, t, solve_prompts[t.id]["reward"], cfg.eval_samples,
            cfg.eval_temperature, cfg.eval_max_new_tokens or pcfg.max_response_tokens, sandbox,
            jax.random.fold_in(rng, 100 + i), cfg.workers, cfg.demo_timeout_s)
        log(f"warm start: {t.id}: {evals[t.id]['valid_rate']:.0%} of {cfg.eval_samples} samples "
            f"valid (best {evals[t.id]['best_score']})")
    codes = [d.code for t in tasks for d in all_demos[t.id] if d.valid][:cfg.eval_instrument]
    instrument = instrument_accept_rate(model_config, params, tokenizer, codes,
                                        cfg.eval_max_new_tokens or pcfg.max_response_tokens,
                                        jax.random.fold_in(rng, 7)) if codes else {}
    timings["eval_s"] = time.time() - t0
    timings["total_s"] = time.time() - t_start

    flat = [d for t in tasks for d in all_demos[t.id]]
    stats = {
        "key": key, "tasks": [t.id for t in tasks], "config": dataclasses.asdict(cfg),
        "prompt_config": dataclasses.asdict(pcfg), "libraries": list(libraries),
        "model": {**dataclasses.asdict(model_config), "num_params": model_config.num_params()},
        "tokenizer": {"vocab_size": tokenizer.vocab_size, "corpus_docs": len(corpus)},
        "data": {"examples": kinds, "dropped": dropped,
                 "mean_prompt_tokens": float(np.mean([len(e.prompt_ids) for e in examples])),
                 "mean_response_tokens": float(np.mean([len(e.response_ids) for e in examples]))},
        "demos": [{"task_id": d.task_id, "family": d.family, "duration_s": d.duration_s,
                   "status": d.status, "valid": d.valid, "score": d.score} for d in flat],
        "sft": sft_stats, "eval": evals, "instrument": instrument, "timings": timings,
    }
    (tmp / "stats.json").write_text(json.dumps(stats, indent=2, default=str))
    (tmp / "prompts.json").write_text(json.dumps(solve_prompts, indent=2))
    demos_lib.save_demos(tmp / "demos.jsonl", flat)
    (tmp / "DONE").write_text(key + "\n")
    if final.exists():  # a stale or forced rebuild
        shutil.rmtree(final)
    os.replace(tmp, final)
    log(f"warm start: built {final} in {timings['total_s']:.0f}s")
    return WarmStart(model_config, params, final / "hf", flat, stats, cached=False)
