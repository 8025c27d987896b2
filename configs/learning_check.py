"""The learning check of the embedded default (issue 11, point 3): configs/task.py unchanged,
on seeds the hyper-parameter sweep (configs/sweep_tiny.py, seeds 0 and 1) did not use.

Launch (resumes; ~8 min per run on 2 cores):
  python experiments/sweep.py --config configs/learning_check.py --workdir workdirs/learning_check
  python experiments/sweep.py --config configs/learning_check.py:synthetic-tradeoff \
      --workdir workdirs/learning_check_tradeoff
On tasks no setting was chosen on (docs/learning_check/results_{titanic,diamonds,leaf,email}.md;
a task directory goes where the task id goes):
  python scripts/make_task_dir.py titanic-survival /work/tasks/titanic-survival
  python experiments/sweep.py --config configs/learning_check.py:/work/tasks/titanic-survival \
      --workdir workdirs/lc_titanic
  python experiments/sweep.py --config configs/learning_check.py:diamonds-price \
      --workdir workdirs/lc_diamonds
  python experiments/sweep.py --config configs/learning_check.py:leaf-species \
      --workdir workdirs/lc_leaf
  python experiments/sweep.py --config configs/learning_check.py:email-spam \
      --workdir workdirs/lc_email

results.md gets, per seed, the first vs last quarter batch reward, the best-of-N valid rate and
the test pick before vs after RL (rl4mle_jax.study.learning_table).
"""

import ml_collections

from configs.sweep_base import sweep_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return sweep_config({"default": ()}, seeds=(2, 3, 4), arg=arg)
