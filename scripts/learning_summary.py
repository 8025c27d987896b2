"""Issue 11's learning check over several studies: one row per study, then every run pooled.

Each argument is a study root (what `experiments/sweep.py --workdir` wrote), optionally with
the variant to read (`ROOT:VARIANT`; default: every variant of the root). One row per root and
variant, named by the task in the runs' config.json (two roots may hold different code or
settings, so their seeds are never merged into one row). Prints the markdown table of
`study.pooled_learning_table`: per row the mean reward gain, best-of-N valid-rate gain and
test-pick change over its runs and how many goals the means meet; pooled, each mean ± its
standard error over runs and how many runs meet each goal.

  python scripts/learning_summary.py workdirs/lc_titanic:default workdirs/lc_diamonds \\
      workdirs/lc_leaf workdirs/lc_email

Only finished runs count (those with a final best-of-N evaluation); the others are named on
stderr, so a study still running can be read without its partial runs.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rl4mle_jax import study  # noqa: E402


def groups_of(args: list[str]) -> dict[str, list[study.Run]]:
    """{"<task> (<variant>, <root>)": finished runs} over the roots (`ROOT` or `ROOT:VARIANT`)."""
    groups: dict[str, list[study.Run]] = {}
    for arg in args:
        root, _, variant = arg.partition(":")
        if not Path(root).is_dir():
            raise SystemExit(f"{root}: not a directory (a study root or a run workdir)")
        found = study.load_study(root)
        if variant:
            if variant not in found:
                raise SystemExit(f"{root}: no variant {variant!r} (has: {', '.join(found)})")
            found = {variant: found[variant]}
        for v, runs in found.items():
            for r in runs:
                if r.final is None:
                    print(f"skipped {r.workdir}: no final evaluation (unfinished)",
                          file=sys.stderr)
                    continue
                name = Path(study.run_task(r)).name  # a task directory: its folder's name
                groups.setdefault(f"{name} ({v}, {Path(root).name})", []).append(r)
    return groups


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(__doc__)
    groups = groups_of(argv)
    if not groups:
        raise SystemExit("no runs found under " + " ".join(argv))
    print(study.pooled_learning_table(groups))


if __name__ == "__main__":
    main(sys.argv[1:])
