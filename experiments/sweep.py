"""Run the ablation variants (× seeds) of a sweep config; write one table and one overlay plot.

  python experiments/sweep.py --config configs/ablations.py [--workdir DIR]

Each run is a normal `train` run in DIR/<variant>/seed<k> (so it resumes if interrupted);
results.md / results.json hold the table, reward.png and best_score.png the overlays.
"""

import copy
import json
import logging
import sys
from pathlib import Path

import numpy as np
from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rl4mle_jax.tracking import read_metrics  # noqa: E402
from rl4mle_jax.train import train  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Sweep config (configs/ablations.py).")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/ablations", "Output directory.")
flags.mark_flags_as_required(["config"])


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return (float(np.mean(xs)), float(np.std(xs)), len(xs)) if xs else (None, None, 0)


def overlay(results: dict, key: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (variant, runs) in enumerate(results.items()):
        for j, run in enumerate(runs):
            rows = [r for r in read_metrics(Path(run["workdir"]) / "metrics.jsonl") if key in r]
            if rows:
                ax.plot([r["wall_s"] / 60 for r in rows], [r[key] for r in rows],
                        color=f"C{i}", alpha=0.8, label=variant if j == 0 else None)
    ax.set_xlabel("wall-clock (min)")
    ax.set_title(key)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def main(argv):
    del argv
    # Our own log lines at INFO; the libraries' (orbax, jax) only from WARNING up.
    absl_logging.set_verbosity(absl_logging.WARNING)
    logging.getLogger("rl4mle_jax").setLevel(logging.INFO)
    sweep, root = _CONFIG.value, Path(_WORKDIR.value)
    results = {}
    for variant, overrides in sweep.variants.items():
        results[variant] = []
        for seed in sweep.seeds:
            cfg = copy.deepcopy(sweep.base)
            cfg.update_from_flattened_dict(dict(overrides))
            cfg.seed = int(seed)
            workdir = root / variant / f"seed{seed}"
            summary = train(cfg, workdir)
            results[variant].append({"seed": seed, "workdir": str(workdir),
                                     "initial": summary["initial"], "final": summary["final"],
                                     "best_score": summary["loop"]["best_score"],
                                     "steps": summary["loop"]["step"]})
    lines = ["| variant | seeds | final pick test score | final best-of-N valid rate | "
             "best reward-split score during RL | initial pick test score |",
             "|---|---|---|---|---|---|"]
    for variant, runs in results.items():
        cells = [_mean([r["final"]["pick_test_score"] for r in runs]),
                 _mean([r["final"]["valid_rate"] for r in runs]),
                 _mean([r["best_score"] for r in runs]),
                 _mean([r["initial"]["pick_test_score"] for r in runs])]
        fmt = ["—" if m is None else f"{m:.4f} ± {s:.4f} (n={n})" for m, s, n in cells]
        lines.append(f"| {variant} | {len(runs)} | " + " | ".join(fmt) + " |")
    root.mkdir(parents=True, exist_ok=True)
    (root / "results.md").write_text("\n".join(lines) + "\n")
    (root / "results.json").write_text(json.dumps(results, indent=1, default=str))
    overlay(results, "reward/mean", root / "reward.png")
    overlay(results, "score/best", root / "best_score.png")
    print("\n".join(lines))


if __name__ == "__main__":
    app.run(main)
