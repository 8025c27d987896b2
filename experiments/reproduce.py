"""The reproduction study: variants × seeds × tasks, then figures and a table per task.

  python experiments/reproduce.py --config configs/reproduce.py [--workdir DIR] [--docs DIR]

Runs go to DIR/<task>/<variant>/seed<k> (ordinary train workdirs: a finished run, one with
eval_final.json, is skipped; an interrupted one resumes from its checkpoint; the initial
best-of-N of a seed is shared by the variants it does not depend on, DIR/_initial_evals/). Then,
per task, docs/reproduction/<task>/ gets learning_curves.png (mean batch reward, mean ± std over
seeds: the paper's Fig. 7), trained_dt.png (mean Δt of the trained episodes over time: Fig. 8),
instrumentation.png (reward with and without instrumentation: Fig. 9) and table.md (final pick
on the reward and test splits, valid rates, learner steps, time to the first valid submission),
with the command and the commit it came from.
"""

import copy
import logging
import sys
from pathlib import Path

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rl4mle_jax.allocator import reexec_with_tcmalloc  # noqa: E402

if __name__ == "__main__":
    reexec_with_tcmalloc()  # before JAX allocates anything (rl4mle_jax/allocator.py)

from rl4mle_jax import compile_cache  # noqa: E402
from rl4mle_jax import study as st  # noqa: E402
from rl4mle_jax.train import train  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/reproduce.py")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/reproduce", "Where the runs go.")
_DOCS = flags.DEFINE_string("docs", None, "Figures and tables (default: config.docs_dir).")
_ONLY_FIGURES = flags.DEFINE_bool("only_figures", False, "Redraw from existing runs only.")
flags.mark_flags_as_required(["config"])


def write_figures(task_root: Path, out: Path, command: str, budget_s: float) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    study = st.load_study(task_root)
    out.mkdir(parents=True, exist_ok=True)
    for name, draw in (
            ("learning_curves", lambda ax: st.plot_bands(study, "reward/mean", ax=ax,
                                                         title="Mean batch reward")),
            ("trained_dt", lambda ax: st.plot_trained_dt(study, ax=ax)),
            ("instrumentation", lambda ax: st.plot_bands(
                study, "reward/mean", ax=ax,
                variants=[v for v in ("full", "no_instrumentation") if v in study],
                title="Reward with and without instrumentation"))):
        fig, ax = plt.subplots(figsize=(7, 4))
        draw(ax)
        fig.tight_layout()
        fig.savefig(out / f"{name}.png", dpi=90)
        plt.close(fig)
    (out / "table.md").write_text(st.results_markdown(study, command, budget_s, task_root.name))
    return st.ablation_table(study)


def main(argv):
    del argv
    absl_logging.set_verbosity(absl_logging.WARNING)
    logging.getLogger("rl4mle_jax").setLevel(logging.INFO)
    compile_cache.enable()
    cfg, root = _CONFIG.value, Path(_WORKDIR.value)
    docs = Path(_DOCS.value or cfg.docs_dir)
    command = st.run_command("experiments/reproduce.py", sys.argv[1:], drop=("--only_figures",))
    task_overrides = cfg.get("task_overrides", {})  # per task, before the variant's
    for task in cfg.tasks:
        for variant, overrides in cfg.variants.items():
            for seed in cfg.seeds:
                workdir = root / task / variant / f"seed{seed}"
                if _ONLY_FIGURES.value or (workdir / "eval_final.json").exists():
                    continue
                run_cfg = copy.deepcopy(cfg.base)
                for extra in (task_overrides.get(task, ()), overrides):
                    run_cfg.update_from_flattened_dict(dict(extra))
                run_cfg.task, run_cfg.seed = task, int(seed)
                train(run_cfg, workdir, shared_evals=root / "_initial_evals")
        print(write_figures(root / task, docs / task, command, cfg.base.run.time_budget_s))


if __name__ == "__main__":
    app.run(main)
