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
import sys
import time
from pathlib import Path

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from rl4mle_jax.allocator import reexec_with_tcmalloc  # noqa: E402

if __name__ == "__main__":
    reexec_with_tcmalloc()  # before JAX allocates anything (rl4mle_jax/allocator.py)

import numpy as np  # noqa: E402

from rl4mle_jax import compile_cache  # noqa: E402
from rl4mle_jax import study as st  # noqa: E402
from rl4mle_jax.warmstart.check import spread_over_builds  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/warmstart_spread.py")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/ws_spread", "Output directory.")
_ONLY_TABLES = flags.DEFINE_bool("only_tables", False, "Redraw from existing builds only.")
_VARIANTS = flags.DEFINE_list("variants", None, "Build and judge only these variants, in this "
                              "order (default: all of the config's); the tables cover every build.")
flags.mark_flags_as_required(["config"])


def _task_run(config, task_name: str, settings: dict):
    """(the loop's config for `task_name` with these warm-start settings, validated; the task;
    the sandbox the loop would run its programs in)."""
    from rl4mle_jax import components
    from rl4mle_jax.env.sandbox import Sandbox
    from rl4mle_jax.env.tasks import load_task

    cfg = copy.deepcopy(config)
    cfg.task = task_name
    cfg.warmstart.settings.update(settings)
    sections = components.validate_config(cfg)
    task = load_task(task_name, cfg.data_root or None)
    return cfg, task, Sandbox(**sections["env"].sandbox_kwargs(task.timeout_s))


def evaluate_build(config, task_name: str, settings: dict, n: int, eval_seed: int) -> dict:
    """Builds (or loads) the loop's warm start with `settings` and samples it `n` times."""
    import jax

    from rl4mle_jax import components
    from rl4mle_jax.env import prompts
    from rl4mle_jax.models.tokenizer import load_tokenizer
    from rl4mle_jax.warmstart.check import sample_and_run

    cfg, task, sandbox = _task_run(config, task_name, settings)
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


def evaluate_improve(config, task_name: str, hf_dir: str, n_parents: int, per_parent: int,
                     eval_seed: int) -> dict:
    """The build's improve answers: for each of its first `n_parents` valid demonstrations
    (the originals, in generation order), `per_parent` answers to the improve prompt the loop
    would render for it, run in the sandbox and compared with that parent's reward."""
    import jax

    from rl4mle_jax import components
    from rl4mle_jax.env import prompts
    from rl4mle_jax.env.actions import extract_action
    from rl4mle_jax.models.tokenizer import load_tokenizer
    from rl4mle_jax.sampling import Sampler
    from rl4mle_jax.warmstart.cache import load_warmstart
    from rl4mle_jax.warmstart.demo_runs import run_demos
    from rl4mle_jax.warmstart.demos import DemoProgram
    from rl4mle_jax.warmstart.sft import bucket_len

    cfg, task, sandbox = _task_run(config, task_name, {})
    ws = load_warmstart(Path(hf_dir).parent)
    tokenizer = load_tokenizer(ws.hf_dir)
    pcfg = components._prompt_config(cfg, chat=False)
    ctx = prompts.task_context(task, tuple(ws.stats["libraries"]), "reward", pcfg)
    parents = [d for d in ws.demos if d.valid and "edit_of" not in d.params][:n_parents]
    ids = [tokenizer.encode(prompts.improve_prompt(
        ctx, d.code, d.outcome, cfg=pcfg, count_tokens=lambda t: len(tokenizer.encode(t))).text)
        for d in parents]
    sampler = Sampler(ws.model_config, tokenizer.stop_token_ids, tokenizer.pad_id,
                      prompt_buckets=(bucket_len(max(map(len, ids)), 128),),
                      max_new_tokens=cfg.prompt.max_response_tokens)
    rng = jax.random.PRNGKey(eval_seed)
    children: list[tuple[int, object]] = []
    for i, p_ids in enumerate(ids):
        out = sampler.generate(ws.params, [p_ids] * per_parent, jax.random.fold_in(rng, i),
                               temperature=cfg.sampling.temperature)
        for j in range(per_parent):
            text = tokenizer.decode(out.tokens[j, : out.lengths[j]], skip_special_tokens=True)
            children.append((i, extract_action(text)))
    runnable = [(i, DemoProgram(a.plan, a.code, "sample", {})) for i, a in children if a.ok]
    runs = run_demos(task, [p for _, p in runnable], sandbox,
                     workers=cfg.warmstart.settings.workers, timeout_s=task.timeout_s)
    n = len(children)
    better = same = worse = copies = 0
    for (i, prog), run in zip(runnable, runs):
        copies += prog.code.strip() == parents[i].code.strip()
        if run.valid:
            d = run.reward - parents[i].reward
            better, same, worse = better + (d > 0), same + (d == 0), worse + (d < 0)
    valid = better + same + worse
    return {"parents": len(parents), "n": n, "valid": valid, "valid_rate": valid / max(n, 1),
            "better": better, "same": same, "worse": worse, "copies": copies}


def _groups(rows: list[dict], variants):
    """(task, variant, its rows by seed) for every task and variant that has rows."""
    for task in sorted({r["task"] for r in rows}):
        for variant in variants:
            got = sorted((r for r in rows if r["task"] == task and r["variant"] == variant),
                         key=lambda r: r["seed"])
            if got:
                yield task, variant, got


def write_results(root: Path, command: str, config) -> str:
    rows = [json.loads(p.read_text()) for p in sorted(root.glob("*/*/seed*.json"))]
    commit = st.git_commit(ROOT)
    lines = ["# The warm start's spread between builds\n",
             f"`{command}` (at {commit}; builds from {len({r['commit'] for r in rows})} "
             f"commit(s): {', '.join(sorted({r['commit'] for r in rows}))})\n",
             f"Each build: its own independent {config.eval_samples} samples of the solve prompt "
             f"at T = {config.base.sampling.temperature} (draws keyed by eval_seed "
             f"{config.eval_seed}), run in the sandbox; valid = a graded submission.\n",
             "| task | variant | valid per build (seed: k/N) | mean | sd | of which sampling | "
             "between builds | worst | SFT s |", "|---|---|---|---|---|---|---|---|---|"]
    pooled: dict[str, list] = {}
    for task, variant, got in _groups(rows, config.variants):
        s = spread_over_builds([r["valid_rate"] for r in got], config.eval_samples)
        pooled.setdefault(variant, []).append(s)
        per = ", ".join(f"{r['seed']}: {r['valid']}/{r['n']}" for r in got)
        lines.append(f"| {task} | {variant} | {per} | {s['mean']:.2f} | {s['sd']:.2f} | "
                     f"{s['sampling_sd']:.2f} | {s['build_sd']:.2f} | {s['min']:.2f} | "
                     f"{np.mean([r['sft_s'] for r in got]):.0f} |")
    lines += ["", "Pooled over tasks (mean of the per-task values):", "",
              "| variant | tasks | builds | mean valid | sd | between builds | worst build |",
              "|---|---|---|---|---|---|---|"]
    for variant, stats in pooled.items():
        lines.append(
            f"| {variant} | {len(stats)} | {sum(s['builds'] for s in stats)} | "
            f"{np.mean([s['mean'] for s in stats]):.2f} | "
            f"{np.nanmean([s['sd'] for s in stats]):.2f} | "
            f"{np.nanmean([s['build_sd'] for s in stats]):.2f} | "
            f"{min(s['min'] for s in stats):.2f} |")
    judged = [r for r in rows if "improve" in r]
    if judged:
        lines += ["", f"Improve answers of each build ({config.improve_parents} valid "
                  f"demonstrations as parents, {config.improve_per_parent} answers each, same "
                  "temperature): valid share, and of the valid ones how many beat / equal / fall "
                  "below their parent's reward; verbatim copies of the parent.", "",
                  "| task | variant | valid per build | mean valid | better / same / worse | "
                  "copies |", "|---|---|---|---|---|---|"]
        for task, variant, got in _groups(judged, config.variants):
            imp = [r["improve"] for r in got]
            per = ", ".join(f"{r['seed']}: {r['improve']['valid']}/{r['improve']['n']}"
                            for r in got)
            tot = {k: sum(i[k] for i in imp) for k in ("better", "same", "worse", "copies",
                                                      "n")}
            lines.append(f"| {task} | {variant} | {per} | "
                         f"{np.mean([i['valid_rate'] for i in imp]):.2f} | "
                         f"{tot['better']} / {tot['same']} / {tot['worse']} | "
                         f"{tot['copies']}/{tot['n']} |")
    lines += ["", "Variants (warmstart.settings overrides): " + "; ".join(
        f"{k}: {dict(v) or 'none'}" for k, v in config.variants.items())]
    text = "\n".join(lines) + "\n"
    (root / "results.md").write_text(text)
    return text


def _cells(config, variants):
    """(seed, task as given, task id, variant, its result file's path), seed-major: a stopped
    study has every variant at the seeds it reached."""
    from rl4mle_jax.env.tasks import load_task

    ids = {t: load_task(t, config.base.data_root or None).id for t in config.tasks.split(",")}
    for seed in config.seeds:
        for task_name, tid in ids.items():
            for variant in variants:
                yield seed, task_name, tid, variant


def main(argv):
    del argv
    absl_logging.set_verbosity(absl_logging.WARNING)
    logging.getLogger("rl4mle_jax").setLevel(logging.INFO)
    compile_cache.enable()
    config, root = _CONFIG.value, Path(_WORKDIR.value)
    command = st.run_command("experiments/warmstart_spread.py", sys.argv[1:],
                             drop=("--only_tables", "--variants"))
    commit = st.git_commit(ROOT)
    chosen = _VARIANTS.value or list(config.variants)
    unknown = sorted(set(chosen) - set(config.variants))
    if unknown:
        raise app.UsageError(f"unknown variants {unknown}; the config has {list(config.variants)}")
    todo = () if _ONLY_TABLES.value else chosen
    for seed, task_name, tid, variant in _cells(config, todo):
        out = root / tid / variant / f"seed{seed}.json"
        if out.exists():
            continue
        row = evaluate_build(config.base, task_name,
                             {**dict(config.variants[variant]), "seed": seed},
                             config.eval_samples, config.eval_seed)
        row.update(variant=variant, seed=int(seed), commit=commit)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(row, indent=2, default=str))
        print(f"{tid} {variant} seed {seed}: {row['valid']}/{row['n']} valid (own check "
              f"{row['own_check']['valid_rate']:.2f} of {row['own_check']['n']}; SFT "
              f"{row['sft_s']:.0f}s)", flush=True)
    # Then the improve answers of the variants that ask for them (added to the same files).
    todo = () if _ONLY_TABLES.value else [v for v in config.improve_variants if v in chosen]
    for seed, task_name, tid, variant in _cells(config, todo):
        out = root / tid / variant / f"seed{seed}.json"
        if not out.exists():
            continue
        row = json.loads(out.read_text())
        if "improve" in row:
            continue
        row["improve"] = evaluate_improve(config.base, task_name, row["hf_dir"],
                                          config.improve_parents, config.improve_per_parent,
                                          config.eval_seed)
        out.write_text(json.dumps(row, indent=2, default=str))
        i = row["improve"]
        print(f"{tid} {variant} seed {seed} improve: {i['valid']}/{i['n']} valid, {i['better']} "
              f"better / {i['same']} same / {i['worse']} worse", flush=True)
    root.mkdir(parents=True, exist_ok=True)
    print(write_results(root, command, config))


if __name__ == "__main__":
    app.run(main)
