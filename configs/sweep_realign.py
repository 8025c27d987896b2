"""The frozen copy's instrumentation realigned (instrument.realign) against exact verification
only (the default): what the loop learns when the paper's LM instrumentation, not the static
fallback, places the markers of nearly every program (issue 11).

At the tiny scale the frozen copy copies a program with one or two statements rewritten (its
favourite model or imputer) and every marker where it belongs: exact verification accepted
5-8% of a default run's programs offline, realignment 95-98%
(scripts/replay_instrumentation.py, titanic-survival seeds 5-7, 40 programs each), and in the
loop 24% were accepted (report.md, "LM instrumentation acceptance"); the rest ran with the
static instrumenter's markers. Only the verification differs: the same frozen copy answers the
same prompts in both variants. Seed by seed in one process, on the same warm start and initial
draws as configs/learning_check.py's titanic-survival seeds 5-7.

Launch (resumes; ~9.5 min per run on 2 cores):
  python scripts/make_task_dir.py titanic-survival /work/tasks/titanic-survival
  python experiments/sweep.py --config configs/sweep_realign.py:/work/tasks/titanic-survival \\
      --workdir workdirs/sweep_realign
"""

import ml_collections

from configs.sweep_base import sweep_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return sweep_config({"realign": (("instrument.realign", True),), "default": ()},
                        seeds=(5, 6, 7), arg=arg)
