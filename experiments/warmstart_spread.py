"""How much the warm start depends on its build: several builds (warmstart.settings.seed) of
each SFT variant on each task, each judged by its own independent best-of-N draw.

  python experiments/warmstart_spread.py --config configs/warmstart_spread.py \
      --workdir workdirs/ws_spread
  python experiments/warmstart_spread.py \
      --config configs/warmstart_spread.py:diamonds-cut,/work/tasks/titanic-survival \
      --config.seeds="(0,1,2,3)" --workdir workdirs/ws_spread

A build is the loop's own (configs/task.py for the task, its prompts, libraries, sandbox and
warm-start cache, with the variant's settings and the seed); a finished one
(DIR/<task>/<variant>/seed<k>.json) is skipped, so the command resumes. Each build is then
sampled `eval_samples` times at the loop's temperature on the solve prompt it was tuned on
(draws keyed by `eval_seed`, not by the build's seed), and the answers run in the sandbox.
DIR/results.md has per task and variant the valid share of every build, their mean, the
between-build standard deviation, the part of it that `eval_samples` draws alone explain
(binomial), the worst build and the SFT time; then the same pooled over tasks.
"""

import copy
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rl4mle_jax.allocator import reexec_with_tcmalloc  # noqa: E402

if __name__ == "__main__":
    reexec_with_tcmalloc()  # before JAX allocates anything (rl4mle_jax/allocator.py)

import numpy as np  # noqa: E402

from rl4mle_jax import compile_cache  # noqa: E402
from rl4mle_jax import study as st  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/warmstart_spread.py")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/ws_spread", "Output directory.")
_ONLY_TABLES = flags.DEFINE_bool("only_tables", False, "Redraw from existing builds only.")
flags.mark_flags_as_required(["config"])


def evaluate_build(config, task_name: str, settings: dict, n: int, eval_seed: int) -> dict:
    """Builds (or loads) the loop's warm start with `settings` and samples it `n` times."""
    import jax

    from rl4mle_jax import components
    from rl4mle_jax.env import prompts
    from rl4mle_jax.env.sandbox import Sandbox
    from rl4mle_jax.env.tasks import load_task
    from rl4mle_jax.models.tokenizer import load_tokenizer
    from rl4mle_jax.warmstart.check import sample_and_run

    cfg = copy.deepcopy(config)
    cfg.task = task_name
    cfg.warmstart.settings.update(settings)
    sections = components.validate_config(cfg)
    task = load_task(task_name, cfg.data_root or None)
    sandbox = Sandbox(**sections["env"].sandbox_kwargs(task.timeout_s))
    libraries = sorted(prompts.probe_libraries(sandbox, input_dir=task.input_dir("reward")))
    t0 = time.time()
    ws = components.build_warmstart_for(cfg, [task], sandbox, libraries)
    build_s = time.time() - t0
    prompt = json.loads((ws.hf_dir.parent / "prompts.json").read_text())[task.id]["reward"]
    tokenizer = load_tokenizer(ws.hf_dir)
    ev = sample_and_run(ws.model_config, ws.params, tokenizer, task, prompt, n,
                        cfg.sampling.temperature, cfg.prompt.max_response_tokens, sandbox,
                        jax.random.PRNGKey(eval_seed), cfg.warmstart.settings.workers,
                        task.timeout_s)
    own = ws.stats["eval"][task.id]
    return {"task": task.id, "settings": settings, "key": ws.stats["key"],
            "hf_dir": str(ws.hf_dir), "cached": ws.cached, "build_s": build_s,
            "sft_s": ws.stats["sft"]["train_s"], "loss_last10": ws.stats["sft"]["loss_last10_mean"],
            "own_check": {"n": own["n"], "valid_rate": own["valid_rate"]},
            "n": n, "valid": round(ev["valid_rate"] * n), "valid_rate": ev["valid_rate"],
            "parse_ok": ev["parse_ok"], "failures": ev["failures"], "scores": ev["scores"],
            "families": ev["families"]}


def spread_row(rates: list[float], n: int) -> dict:
    """Mean valid share over builds, their std (ddof 1), the std `n` binomial draws alone give
    around those shares, and the between-build std left once that is taken out."""
    p = np.asarray(rates, float)
    sd = float(p.std(ddof=1)) if len(p) > 1 else float("nan")
    sampling = float(np.sqrt(np.mean(p * (1 - p)) / n))
    build = float(np.sqrt(max(sd ** 2 - sampling ** 2, 0.0))) if len(p) > 1 else float("nan")
    return {"mean": float(p.mean()), "sd": sd, "sampling_sd": sampling, "build_sd": build,
            "min": float(p.min()), "max": float(p.max()), "builds": len(p)}


def _commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=Path(__file__).resolve().parents[1]).stdout.strip()


def write_results(root: Path, command: str, config) -> str:
    rows = [json.loads(p.read_text()) for p in sorted(root.glob("*/*/seed*.json"))]
    commit = _commit()
    lines = ["# The warm start's spread between builds\n",
             f"`{command}` (at {commit}; builds from {len({r['commit'] for r in rows})} "
             f"commit(s): {', '.join(sorted({r['commit'] for r in rows}))})\n",
             f"Each build: its own independent {config.eval_samples} samples of the solve prompt "
             f"at T = {config.base.sampling.temperature} (draws keyed by eval_seed "
             f"{config.eval_seed}), run in the sandbox; valid = a graded submission.\n",
             "| task | variant | valid per build (seed: k/N) | mean | sd | of which sampling | "
             "between builds | worst | SFT s |", "|---|---|---|---|---|---|---|---|---|"]
    pooled: dict[str, list] = {}
    for task in sorted({r["task"] for r in rows}):
        for variant in config.variants:
            got = sorted((r for r in rows if r["task"] == task and r["variant"] == variant),
                         key=lambda r: r["seed"])
            if not got:
                continue
            s = spread_row([r["valid_rate"] for r in got], config.eval_samples)
            pooled.setdefault(variant, []).append((s, got))
            per = ", ".join(f"{r['seed']}: {r['valid']}/{r['n']}" for r in got)
            lines.append(f"| {task} | {variant} | {per} | {s['mean']:.2f} | {s['sd']:.2f} | "
                         f"{s['sampling_sd']:.2f} | {s['build_sd']:.2f} | {s['min']:.2f} | "
                         f"{np.mean([r['sft_s'] for r in got]):.0f} |")
    lines += ["", "Pooled over tasks (mean of the per-task values):", "",
              "| variant | tasks | builds | mean valid | sd | between builds | worst build |",
              "|---|---|---|---|---|---|---|"]
    for variant, items in pooled.items():
        stats = [s for s, _ in items]
        lines.append(
            f"| {variant} | {len(items)} | {sum(s['builds'] for s in stats)} | "
            f"{np.mean([s['mean'] for s in stats]):.2f} | "
            f"{np.nanmean([s['sd'] for s in stats]):.2f} | "
            f"{np.nanmean([s['build_sd'] for s in stats]):.2f} | "
            f"{min(s['min'] for s in stats):.2f} |")
    lines += ["", "Variants (warmstart.settings overrides): " + "; ".join(
        f"{k}: {dict(v) or 'none'}" for k, v in config.variants.items())]
    text = "\n".join(lines) + "\n"
    (root / "results.md").write_text(text)
    return text


def main(argv):
    del argv
    absl_logging.set_verbosity(absl_logging.WARNING)
    logging.getLogger("rl4mle_jax").setLevel(logging.INFO)
    compile_cache.enable()
    config, root = _CONFIG.value, Path(_WORKDIR.value)
    command = st.run_command("experiments/warmstart_spread.py", sys.argv[1:],
                             drop=("--only_tables",))
    commit = _commit()
    for seed in config.seeds:  # seed-major: a stopped study has every variant at its seeds
        for task_name in config.tasks.split(","):
            for variant, overrides in config.variants.items():
                if _ONLY_TABLES.value:
                    continue
                from rl4mle_jax.env.tasks import load_task

                tid = load_task(task_name, config.base.data_root or None).id
                out = root / tid / variant / f"seed{seed}.json"
                if out.exists():
                    continue
                row = evaluate_build(config.base, task_name, {**dict(overrides), "seed": seed},
                                     config.eval_samples, config.eval_seed)
                row.update(variant=variant, seed=int(seed), commit=commit)
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps(row, indent=2, default=str))
                print(f"{tid} {variant} seed {seed}: {row['valid']}/{row['n']} valid "
                      f"(own check {row['own_check']['valid_rate']:.2f} of "
                      f"{row['own_check']['n']}; SFT {row['sft_s']:.0f}s)", flush=True)
    root.mkdir(parents=True, exist_ok=True)
    print(write_results(root, command, config))


if __name__ == "__main__":
    app.run(main)
