"""Failure credit: a syntax error's advantage on the line the parser names (issue 11).

In the default's runs most failures are syntax errors (250 of 362 failed episodes in
docs/sweep_critic's six runs; 89 runtime errors, 23 empty code blocks), and most of those are
one garbled line in an otherwise copied program (`{"C": [0.0)`). With the paper's sequence
credit such an episode pushes down all ~260 of its tokens, the ~240 it shares with valid
programs included; `learner.failure_credit="error_line"` (rollout/credit.py) gives its
advantage to the tokens of the named line only. This runs it on the learning check's seeds and
initial draws (the initial evaluations are those of docs/sweep_critic: copy
workdirs/sweep_critic/_initial_evals into the workdir to reuse them), and against the
default (`sequence`) in the same session: the machine's speed differs between sessions (the
default made 29-31 steps in docs/sweep_critic's session and 42-44 in this one), so only runs of
one session compare.

Measured at dadc1c8 (docs/sweep_credit/results.md, nothing else running, seeds 2-4, same initial
draws): error_line learned no more than the paper's credit (valid-rate gain +0.15 against
+0.22, reward gain +2.22 against +1.93, test pick +0.0009 against +0.0007), and did not make a
larger step safe: at actor lr 1e-4 it collapsed on seed 3 (best-of-32 valid 0.66 -> 0.50, pick
-0.036) and lowered the pick on every seed. configs/task.py keeps "sequence".

Launch (resumes; ~10 min per run on 2 cores):
  python experiments/sweep.py --config configs/sweep_credit.py --workdir workdirs/sweep_credit
"""

import ml_collections

from configs.sweep_base import sweep_config

VARIANTS = {
    "error_line": (("learner.failure_credit", "error_line"),),
    "sequence": (),  # configs/task.py: the paper's credit
    # Whether the localised signal takes a larger step: with sequence credit lr 1e-4
    # destabilised one seed of three (docs/sweep_updates), each failure pushing down ~240
    # tokens it shares with valid programs.
    "error_line_lr1e-4": (("learner.failure_credit", "error_line"), ("learner.actor_lr", 1e-4)),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return sweep_config(VARIANTS, seeds=(2, 3, 4), arg=arg)
