"""The test pick's change and its standard error, for runs evaluated before the grader kept
bootstrap replicates (issue 11's pick goal, docs/learning_check).

`study.learning_check` pairs the two picks' test-score replicates (`GradeReport.score_boot`,
every submission of a task scored on the same resamples), so runs evaluated since give the
change's standard error by themselves. For an older run this re-runs each pick's program in
the run's sandbox on the test split, checks that it reproduces the recorded test score (a
program whose score moved is reported, never paired), and prints per run the picks' test
scores, the change (oriented: > 0 is better) and its paired standard error, then the mean over
runs ± the root of the summed variances / n.

  python scripts/pick_se.py workdirs/lc_titanic/default/seed2 workdirs/lc_titanic/ties1/seed*

A few seconds per program run on 2 cores (the task's programs, twice per run at most).
"""

import json
import sys
from pathlib import Path

import numpy as np
from absl import app

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from configs import task as task_config  # noqa: E402
from rl4mle_jax import study  # noqa: E402
from rl4mle_jax.components import validate_config  # noqa: E402
from rl4mle_jax.env.execute import run_and_grade  # noqa: E402
from rl4mle_jax.env.metrics import oriented_score  # noqa: E402
from rl4mle_jax.env.sandbox import Sandbox  # noqa: E402
from rl4mle_jax.env.tasks import load_task  # noqa: E402

# A re-run's test score must match the recorded one this closely to be paired with it.
REPRODUCE_ATOL = 1e-9


def pick_replicates(evaluation: dict, task, sandbox: Sandbox
                    ) -> tuple[list[float] | None, str]:
    """(the pick's test-score replicates, how they were had)."""
    pick = evaluation.get("pick") or {}
    if pick.get("test_score_boot"):
        return pick["test_score_boot"], "recorded"
    for c in evaluation.get("candidates", []):  # evaluated with replicates, before the pick
        rec = c.get("test_split") or {}  # kept them
        boot = (rec.get("grade") or {}).get("score_boot")
        if c.get("code") == pick.get("code") and rec.get("score") == pick.get("test_score") \
                and boot:
            return boot, "recorded"
    if pick.get("code") is None or pick.get("test_score") is None:
        return None, "no valid pick"
    run = run_and_grade(pick["code"], task, sandbox, split="test")
    got = run.grade.score if run.grade is not None and run.grade.valid else None
    if got is None or abs(got - pick["test_score"]) > REPRODUCE_ATOL:
        return None, f"re-run scored {got}, recorded {pick['test_score']}: not reproducible"
    return run.grade.score_boot, "re-run"


def main(argv):
    rows = []
    for run_dir in map(Path, argv[1:]):
        config = task_config.get_config()
        config.update(json.loads((run_dir / "config.json").read_text()))
        env = validate_config(config)["env"]
        task = load_task(config.task, data_root=config.data_root or None)
        sandbox = Sandbox(**env.sandbox_kwargs(task.timeout_s))
        evals = [json.loads((run_dir / f"eval_{w}.json").read_text())
                 for w in ("initial", "final")]
        direction = evals[1].get("direction", task.direction)
        picks = [e.get("pick") or {} for e in evals]
        got = [pick_replicates(e, task, sandbox) for e in evals]
        t0, t1 = (p.get("test_score") for p in picks)
        gain = (None if None in (t0, t1)
                else oriented_score(t1, direction) - oriented_score(t0, direction))
        se = study.paired_se(got[0][0], got[1][0])
        rows.append((gain, se))
        how = "; ".join(f"{w} {h}" for w, (_, h) in zip(("initial", "final"), got))
        print(f"{run_dir}: test pick {t0} -> {t1}, change "
              f"{study.fmt_value(gain, 4, True)} ± {study.fmt_value(se, 4)} ({how})")
    gains = [g for g, _ in rows if g is not None]
    if gains:
        se = study.mean_se([s for g, s in rows if g is not None])
        print(f"mean over {len(gains)} runs: {np.mean(gains):+.4f} ± {study.fmt_value(se, 4)}")


if __name__ == "__main__":
    app.run(main)
