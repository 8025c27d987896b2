"""Run the variants (× seeds) of a sweep config; write its tables and overlay plots.

  python experiments/sweep.py --config configs/sweep_tiny.py [--workdir DIR]

Each run is a normal `train` run in DIR/<variant>/seed<k>: a finished one (eval_final.json) is
skipped, an interrupted one resumes from its checkpoint; variants that change only the learner
or the loop share each seed's initial best-of-N (DIR/_initial_evals/). DIR/results.md holds,
with the command and the commit, the ablation table (rl4mle_jax.study.ablation_table) and the
learning checks of every run (study.learning_table: first vs last quarter batch reward,
best-of-N valid rate and test pick before vs after); reward.png and valid_rate.png the mean ±
std bands over seeds.
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

_CONFIG = config_flags.DEFINE_config_file("config", None, "Sweep config (configs/ablations.py).")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/ablations", "Output directory.")
_ONLY_TABLES = flags.DEFINE_bool("only_tables", False, "Redraw from existing runs only.")
_VARIANTS = flags.DEFINE_list("variants", None, "Run only these variants, in this order "
                              "(default: all of the config's); the tables cover every run.")
flags.mark_flags_as_required(["config"])


SMOOTH = 5  # learner steps in the moving mean of the plotted curves (batches of 8 are noisy)


def write_results(root: Path, command: str, budget_s: float) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    study = st.load_study(root)
    for key, name in (("reward/mean", "reward"), ("reward/valid_rate", "valid_rate")):
        fig, ax = plt.subplots(figsize=(7, 4))
        st.plot_bands(study, key, ax=ax, smooth=SMOOTH,
                      title=f"{key}, moving mean over {SMOOTH} steps (mean ± std over seeds)")
        fig.tight_layout()
        fig.savefig(root / f"{name}.png", dpi=90)
        plt.close(fig)
    text = st.results_markdown(study, command, budget_s)
    (root / "results.md").write_text(text)
    return text


def main(argv):
    del argv
    # Our own log lines at INFO; the libraries' (orbax, jax) only from WARNING up.
    absl_logging.set_verbosity(absl_logging.WARNING)
    logging.getLogger("rl4mle_jax").setLevel(logging.INFO)
    compile_cache.enable()
    sweep, root = _CONFIG.value, Path(_WORKDIR.value)
    command = st.run_command("experiments/sweep.py", sys.argv[1:],
                             drop=("--only_tables", "--variants"))
    variant_seeds = sweep.get("variant_seeds", {})
    names = _VARIANTS.value or list(sweep.variants)
    unknown = sorted(set(names) - set(sweep.variants))
    if unknown:
        raise app.UsageError(f"unknown variants {unknown}; the config has {list(sweep.variants)}")
    # Seed by seed, every variant of a seed in turn: variants are compared on runs made close
    # together in time, so a drift in the machine's speed hits them alike.
    runs = [(variant, seed) for variant in names
            for seed in variant_seeds.get(variant, sweep.seeds)]
    seed_order = list(dict.fromkeys(seed for _, seed in runs))
    for variant, seed in sorted(runs, key=lambda r: seed_order.index(r[1])):
        workdir = root / variant / f"seed{seed}"
        if _ONLY_TABLES.value or (workdir / "eval_final.json").exists():
            continue
        cfg = copy.deepcopy(sweep.base)
        cfg.update_from_flattened_dict(dict(sweep.variants[variant]))
        cfg.seed = int(seed)
        train(cfg, workdir, shared_evals=root / "_initial_evals")
    root.mkdir(parents=True, exist_ok=True)
    print(write_results(root, command, sweep.base.run.time_budget_s))


if __name__ == "__main__":
    app.run(main)
