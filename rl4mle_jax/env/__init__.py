"""MLE environment: tasks, reward split, grading, sandboxed execution. Never imports jax."""

from rl4mle_jax.env.grading import GradeReport, grade
from rl4mle_jax.env.tasks import (
    Task,
    TaskSpecError,
    default_data_root,
    list_tasks,
    load_task,
    prepare_task,
)

__all__ = ["GradeReport", "Task", "TaskSpecError", "default_data_root", "grade", "list_tasks",
           "load_task", "prepare_task"]
