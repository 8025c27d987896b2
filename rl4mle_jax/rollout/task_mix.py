"""Multi-task training's task draw: which task each episode is for, and which tasks are live.

One policy learns several tasks (`config.tasks`); each episode is for one of them, drawn when
its slot frees up. Two rules (`run.task_sampling`), over the live tasks L (n = |L|; a task
dropped after a failed SFT rescue has p = 0):

  uniform:     p_t = 1 / n
  separation:  p_t = floor / n + (1 − floor) · s_t / Σ_{u ∈ L} s_u      (1 / n if Σ s = 0)

s_t is the task's *separation*: the share of groups of `group` consecutive trained episodes of
task t, among its last `window`, whose rewards are not all equal (the filter's statistic,
`separation`). PPO learns only from reward differences, so a task whose recent groups all
scored alike teaches nothing and is drawn less; `floor` (`run.task_sampling_floor`) keeps a
floor/n share for each task so none starves and a task can show separation again. A task with
no whole group yet counts as s_t = 1 (untried tasks get tried).

The draw of episode e is u ~ U[0, 1) from a NumPy generator seeded with (seed, e), mapped
through the cumulative p of the live tasks in config order: a pure function of the seed, the
episode id and the recorded history, so a resumed run (whose episode ids continue and whose
history is in the checkpoint) continues the same draw. Not JAX: host-side bookkeeping.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

TASK_SAMPLING = ("uniform", "separation")  # RunConfig.task_sampling


def separation(rewards: Any, group_size: int, tol: float = 1e-9) -> float | None:
    """Share of consecutive groups of `group_size` rewards that are not all equal.

    A trailing partial group is left out; None when there is no whole group.
    """
    r = np.asarray(rewards, np.float64)
    groups = len(r) // group_size
    if group_size < 2 or groups == 0:
        return None
    r = r[:groups * group_size].reshape(groups, group_size)
    return float(np.mean(r.max(axis=1) - r.min(axis=1) > tol))


def sampling_probs(separations: Sequence[float | None], live: Sequence[bool], mode: str,
                   floor: float) -> np.ndarray:
    """p_t of the module docstring, float64 [n_tasks]; None separation counts as 1."""
    if mode not in TASK_SAMPLING:
        raise ValueError(f"task sampling {mode!r} is not one of {TASK_SAMPLING}")
    alive = np.asarray(live, bool)
    n = int(alive.sum())
    if n == 0:
        raise ValueError("no live task left to draw from")
    uniform = alive / n
    if mode == "uniform":
        return uniform
    s = np.asarray([1.0 if x is None else x for x in separations], np.float64) * alive
    share = s / s.sum() if s.sum() > 0 else uniform
    return floor * uniform + (1.0 - floor) * share


def task_group_ids(task_index_b: Sequence[int], group_size: int) -> np.ndarray:
    """Group ids [B] for a group-baseline estimator that never put two tasks in one group:
    each task's rows, in batch order, in consecutive groups of `group_size` (0: one group per
    task). Ids are task_index · B + the group's rank within the task."""
    t = np.asarray(task_index_b, np.int64)
    b = len(t)
    rank = np.zeros(b, np.int64)
    for task in np.unique(t):
        rows = np.flatnonzero(t == task)
        rank[rows] = np.arange(len(rows)) // group_size if group_size else 0
    return (t * b + rank).astype(np.int32)


@dataclasses.dataclass
class TaskMix:
    """The task of each episode, each task's recent rewards and which tasks are dropped."""

    task_ids: list[str]
    mode: str = "uniform"
    floor: float = 0.25
    window: int = 32
    group: int = 4
    seed: int = 0
    rewards: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # last `window`
    dropped: dict[str, str] = dataclasses.field(default_factory=dict)  # task -> why
    drawn: dict[str, int] = dataclasses.field(default_factory=dict)  # episodes started

    def __post_init__(self):
        if len(set(self.task_ids)) != len(self.task_ids) or not self.task_ids:
            raise ValueError(f"task ids must be distinct and non-empty, got {self.task_ids}")
        for t in self.task_ids:
            self.rewards.setdefault(t, [])
            self.drawn.setdefault(t, 0)

    @property
    def live(self) -> list[str]:
        return [t for t in self.task_ids if t not in self.dropped]

    def separations(self) -> list[float | None]:
        return [separation(self.rewards[t], self.group) for t in self.task_ids]

    def probs(self) -> np.ndarray:
        return sampling_probs(self.separations(), [t not in self.dropped for t in self.task_ids],
                              self.mode, self.floor)

    def draw(self, episode_id: int) -> str:
        """The task of episode `episode_id` (counted in `drawn`)."""
        u = np.random.default_rng([self.seed, episode_id]).random()
        cdf = np.cumsum(self.probs())
        i = min(int(np.searchsorted(cdf, u, side="right")), len(cdf) - 1)
        while self.task_ids[i] in self.dropped:  # u at the very top of the cdf
            i -= 1
        task = self.task_ids[i]
        self.drawn[task] += 1
        return task

    def observe(self, task: str, rewards: Sequence[float]) -> None:
        """Trained episodes of `task`, in batch order."""
        hist = collections.deque(self.rewards[task], maxlen=self.window)
        hist.extend(float(r) for r in rewards)
        self.rewards[task] = list(hist)

    def drop(self, task: str, why: str) -> None:
        """No more episodes for `task`; refused for the last live task (the run stops then)."""
        if self.live == [task]:
            raise ValueError(f"{task} is the last live task; stop the run instead")
        self.dropped[task] = why

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_state_dict(cls, d: dict[str, Any]) -> TaskMix:
        return cls(**d)
