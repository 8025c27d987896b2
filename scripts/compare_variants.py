"""Two variants of one or more sweeps, seed by seed: A − B of each learning-check quantity.

Each argument is a study root (what `experiments/sweep.py --workdir` wrote) holding both
variants; `--a` and `--b` name them. Within a root the two variants of a seed share its initial
draws, so the paired difference removes the seed's own luck; pooled over roots it says whether
A beats B across tasks, with the mean difference ± its standard error over pairs
(`study.paired_table`). Only finished runs count (those with a final evaluation).

  python scripts/compare_variants.py --a agree --b default \\
      workdirs/sweep_agree workdirs/sweep_agree_telco workdirs/sweep_agree_digits
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rl4mle_jax import study  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("roots", nargs="+", help="study roots holding both variants")
    ap.add_argument("--a", required=True, help="the variant tried")
    ap.add_argument("--b", default="default", help="the variant it is measured against")
    args = ap.parse_args(argv)
    studies = {}
    for root in args.roots:
        if not Path(root).is_dir():
            raise SystemExit(f"{root}: not a directory (a study root)")
        found = study.load_study(root)
        missing = [v for v in (args.a, args.b) if v not in found]
        if missing:
            raise SystemExit(f"{root}: no variant {missing[0]!r} (has: {', '.join(found)})")
        studies[Path(root).name] = {v: [r for r in found[v] if r.final is not None]
                                    for v in (args.a, args.b)}
    print(study.paired_table(studies, args.a, args.b))


if __name__ == "__main__":
    main()
