"""Validate a task before any work: task.json against its files, every problem named.

    python -m rl4mle_jax.env validate DIR [--max-prompt-tokens N]

Each problem names the file (and the task.json field) and says what to write instead. Beyond
reading the files, validation does once what a run will do: it carves the reward split into
a scratch directory, grades the answers themselves and the sample submission on both splits,
and renders the solve prompt within the budget. So a task that validates does not fail later
for a reason validation could have seen; a run (`experiments/run.py`) validates first.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rl4mle_jax.env.metrics import METRICS
from rl4mle_jax.env.tasks import (
    Task,
    TaskSpecError,
    _discover,
    spec_problems,
)

MIN_REWARD_ROWS = 10  # fewer held-out rows than this cannot rank programs (a warning)
_NUMBER_KINDS = ("probability", "distribution", "numeric", "nonnegative", "integer")


@dataclass(frozen=True)
class Problem:
    """One problem: where (file, and field), what is wrong, what to write instead."""

    severity: str  # "error" | "warning"
    where: str
    message: str
    fix: str = ""

    def __str__(self) -> str:
        return f"{self.severity}: {self.where}: {self.message}" + (
            f" -> {self.fix}" if self.fix else "")


@dataclass
class Validation:
    """What `validate_task` found; `ok` when there is no error (warnings may remain)."""

    path: str
    task_id: str | None = None
    problems: list[Problem] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)  # what was verified, in order
    task: Task | None = field(default=None, repr=False)  # the loaded task, when it loaded

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "task": self.task_id, "ok": self.ok,
                "errors": [str(p) for p in self.errors],
                "warnings": [str(p) for p in self.warnings], "checked": self.checked}

    def raise_for_errors(self) -> None:
        if self.errors:
            lines = "\n  ".join(str(p) for p in self.errors)
            raise TaskSpecError(f"task {self.task_id or self.path} does not validate "
                                f"({len(self.errors)} errors):\n  {lines}\n(check it with "
                                f"`python -m rl4mle_jax.env validate {self.path}`)")


class _Report:
    def __init__(self, out: Validation):
        self.out = out

    def error(self, where: str, message: str, fix: str = "") -> None:
        self.out.problems.append(Problem("error", where, message, fix))

    def warn(self, where: str, message: str, fix: str = "") -> None:
        self.out.problems.append(Problem("warning", where, message, fix))


def _show(values, n: int = 5) -> str:
    vals = [str(v) for v in list(values)[:n]]
    vals = [v if len(v) <= 40 else v[:37] + "..." for v in vals]
    more = len(values) - n if len(values) > n else 0
    return "[" + ", ".join(repr(v) for v in vals) + (f", ... {more} more" if more else "") + "]"


def _read_table(path: Path) -> pd.DataFrame:
    if path.suffix == ".json":
        return pd.DataFrame(json.loads(path.read_text())).astype(str)
    df = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[])
    df.columns = [str(c).strip() for c in df.columns]
    return df


def _floats(values) -> np.ndarray | None:
    try:
        return np.asarray([float(str(v).strip()) for v in values], dtype=float)
    except ValueError:
        return None


# ----------------------------------------------------------------------------- the check


def validate_task(path_or_id: str | Path, *, data_root: str | Path | None = None,
                  max_prompt_tokens: int | None = None,
                  libraries: tuple[str, ...] | None = None, count_tokens=None,
                  warmstart: bool = True) -> Validation:
    """Check a task directory (or a suite / MLE-bench id) without changing it.

    max_prompt_tokens: the prompt budget to check the description against (default: the
      embedded default's, `run_config.PromptLimits`). libraries: what the prompt lists as
      installed (default: probed with this interpreter). count_tokens: the run's tokenizer's
      counter (default: the approximate count, ~3.5 characters a token). warmstart: also
      check that the warm start can write demonstrations for the task (a run without
      `model.hf_dir` needs them).
    """
    from rl4mle_jax.env.tasks import load_task

    p = Path(str(path_or_id)).expanduser()
    out = Validation(str(p.resolve()) if p.exists() else str(path_or_id))
    rep = _Report(out)
    if not p.exists():  # an id: the suite builds its own tasks; still check the prompt
        try:
            task = load_task(str(path_or_id), data_root)
        except TaskSpecError as e:
            rep.error(str(path_or_id), str(e))
            return out
        out.task_id, out.task = task.id, task
        out.checked.append("loaded by id")
    else:
        task = _load_spec(p.resolve(), rep, data_root)
        if task is None:
            return out
        out.task_id, out.task = task.id, task
        _check_contents(task, rep)
        if out.errors:
            return out
    _dry_run(task, rep, max_prompt_tokens, libraries, count_tokens, warmstart)
    return out


def _load_spec(path: Path, rep: _Report, data_root) -> Task | None:
    """task.json (or MLE-bench's spec) -> Task, collecting every spec problem."""
    from rl4mle_jax.env.tasks import load_task_dir

    if path.name == "prepared" and (path / "public").is_dir():
        path = path.parent
    spec_file = path / "task.json"
    mlebench = (path / "prepared" / "public").is_dir()
    if not spec_file.exists() and not mlebench:
        rep.error(str(path), "not a task directory: no task.json",
                  "write one with `python -m rl4mle_jax.env new DIR --metric M --id-column ID "
                  "--target COL`, next to public/ and private/")
        return None
    if spec_file.exists():
        try:
            spec = json.loads(spec_file.read_text())
        except json.JSONDecodeError as e:
            rep.error("task.json", f"not valid JSON ({e})")
            return None
        if not isinstance(spec, dict):
            rep.error("task.json", "must hold a JSON object")
            return None
        for prob in spec_problems(spec):
            where = f"task.json: field {prob.field!r}"
            (rep.error if prob.severity == "error" else rep.warn)(where, prob.message, prob.fix)
        if rep.out.errors:
            return None
    public = path / "prepared" / "public" if mlebench else path / "public"
    private = path / "prepared" / "private" if mlebench else path / "private"
    for d, name in ((public, "public"), (private, "private")):
        if not d.is_dir():
            rep.error(str(d), f"the {name}/ directory does not exist",
                      "public/ holds what the agent sees (train, test, sample submission), "
                      "private/ the test answers")
    if rep.out.errors:
        return None
    try:
        task = load_task_dir(path, data_root=Path(data_root) if data_root else None)
    except TaskSpecError as e:
        rep.error(str(spec_file), str(e))
        return None
    if spec_file.exists():
        disc = _discover(spec, public, private)
        for name in ("train_file", "test_file", "answers_file", "sample_submission_file"):
            if name not in spec and name in disc:
                rep.out.checked.append(f"{name} found: {disc[name]}")
    rep.out.checked.append("task.json fields")
    if task.sample_submission_file is None or not (
            task.public_dir / task.sample_submission_file).exists():
        rep.warn("public/", "no sample submission",
                 "add public/sample_submission.csv (id column + target columns, one row per "
                 "test id): the agent copies its format")
    return task


def _check_contents(task: Task, rep: _Report) -> None:
    """Columns, ids, row counts and values of train / test / sample / answers."""
    metric = METRICS[task.metric]
    idc, targets = task.id_column, list(task.target_columns)
    pub = "prepared/public" if task.layout == "mlebench" else "public"
    priv = "prepared/private" if task.layout == "mlebench" else "private"
    names = {"train": f"{pub}/{task.train_file}", "test": f"{pub}/{task.test_file}",
             "answers": f"{priv}/{task.answers_file}"}
    paths = {"train": task.public_dir / task.train_file, "test": task.public_dir / task.test_file,
             "answers": task.private_dir / task.answers_file}
    if task.sample_submission_file and (task.public_dir / task.sample_submission_file).exists():
        names["sample"] = f"{pub}/{task.sample_submission_file}"
        paths["sample"] = task.public_dir / task.sample_submission_file
    tables: dict[str, pd.DataFrame] = {}
    for key, p in paths.items():
        try:
            tables[key] = _read_table(p)
        except Exception as e:  # noqa: BLE001 - any unreadable file is a named problem
            rep.error(names[key], f"cannot be read as a table ({type(e).__name__}: "
                      f"{str(e)[:200]})")
    if rep.out.errors:
        return
    # The id column, everywhere, unique.
    for key, df in tables.items():
        if idc not in df.columns:
            rep.error(names[key], f"id column {idc!r} not found (columns {_show(df.columns, 8)})",
                      "set task.json field 'id_column' to the column that names each row")
            continue
        ids = df[idc].map(lambda v: str(v).strip())
        dup = ids[ids.duplicated()].unique()
        if len(dup):
            rep.error(names[key], f"{len(dup)} ids repeat in column {idc!r} (e.g. {_show(dup)})",
                      "every row needs its own id")
        if (ids == "").any():
            rep.error(names[key], f"{int((ids == '').sum())} rows have an empty id")
    if rep.out.errors:
        return
    test, ans, train = tables["test"], tables["answers"], tables["train"]
    test_ids, ans_ids = set(test[idc].str.strip()), set(ans[idc].str.strip())
    if test_ids != ans_ids:
        rep.error(names["answers"], f"ids differ from {names['test']}: "
                  f"{len(test_ids - ans_ids)} test ids have no answer (e.g. "
                  f"{_show(sorted(test_ids - ans_ids))}), {len(ans_ids - test_ids)} answers are "
                  f"for ids not in the test file (e.g. {_show(sorted(ans_ids - test_ids))})",
                  "one answers row per test row, same ids")
    if "sample" in tables:
        sample = tables["sample"]
        sample_ids = set(sample[idc].str.strip())
        if sample_ids != test_ids:
            rep.error(names["sample"], f"ids differ from {names['test']} "
                      f"({len(sample_ids)} vs {len(test_ids)} ids, "
                      f"{len(test_ids ^ sample_ids)} not in both)",
                      "one sample row per test id: the agent copies its rows")
        lacking = [c for c in targets if c not in sample.columns]
        if lacking:
            rep.error(names["sample"], f"lacks target columns {lacking} (columns "
                      f"{_show(sample.columns, 8)})", "write the id column and every target "
                      "column of task.json, in that order")
    # Target columns: in the answers, never in test, and learnable from train.
    lacking = [c for c in targets if c not in ans.columns]
    if lacking:
        rep.error(names["answers"], f"lacks target columns {lacking} (columns "
                  f"{_show(ans.columns, 8)})", "the answers hold the id column and every column "
                  "of 'target_columns' (one-hot 0/1 per class for class probabilities)")
    leaked = [c for c in targets + ([task.label_column] if task.label_column else [])
              if c in test.columns]
    if leaked:
        rep.error(names["test"], f"holds the answer columns {leaked}: the agent would read "
                  "the labels", "drop them from the test file (they belong in the answers)")
    in_train = [c for c in targets if c in train.columns]
    if task.label_column:
        if task.label_column not in train.columns:
            rep.error("task.json: field 'label_column'", f"{task.label_column!r} is not a "
                      f"column of {names['train']} (columns {_show(train.columns, 8)})")
        else:
            labels = set(train[task.label_column].astype(str).str.strip())
            unknown = sorted(labels - set(targets))
            if unknown and len(in_train) < len(targets):
                rep.error(names["train"], f"column {task.label_column!r} has labels that are "
                          f"not target columns: {_show(unknown)}",
                          f"target_columns must list every class: {_show(sorted(labels), 12)}")
    elif len(in_train) < len(targets):
        cands = [c for c in train.columns if c not in test.columns and c != idc]
        rep.error(names["train"], f"lacks target columns "
                  f"{[c for c in targets if c not in train.columns]}, and task.json has no "
                  "'label_column'; the reward split cannot be built",
                  (f'if {cands[0]!r} holds the class of each row, add "label_column": '
                   f'{json.dumps(cands[0])} to task.json' if cands else
                   'add the target columns to train, or "label_column": "<train column '
                   'holding the class>" to task.json'))
    if rep.out.errors:
        return
    _check_values(task, metric, ans, names["answers"], rep)
    if len(ans) != len(test):
        rep.error(names["answers"], f"{len(ans)} rows, {names['test']} has {len(test)}")
    n_hold = int(round(len(train) * task.reward_fraction))
    if n_hold < 1 or n_hold >= len(train):
        rep.error(names["train"], f"{len(train)} rows cannot give a reward split of "
                  f"{task.reward_fraction:.0%}", "more rows, or another 'reward_fraction'")
    elif n_hold < MIN_REWARD_ROWS:
        rep.warn(names["train"], f"the reward split holds only {n_hold} rows: rewards will be "
                 "noisy", "more train rows, or a larger 'reward_fraction'")
    rep.out.checked.append(f"{len(train)} train rows, {len(test)} test rows, ids match")


def _check_values(task: Task, metric, ans: pd.DataFrame, where: str, rep: _Report) -> None:
    """The answers' values suit the metric (family by family)."""
    targets = list(task.target_columns)
    if not metric.multi_column and len(targets) != 1:
        rep.error("task.json: field 'target_columns'", f"{metric.name} scores one column, "
                  f"got {targets}", f"one target column, or a metric that scores several "
                  f"({sorted(m for m, x in METRICS.items() if x.multi_column)})")
        return
    if metric.kind == "distribution" and len(targets) < 2:
        rep.error("task.json: field 'target_columns'", f"{metric.name} needs one probability "
                  f"column per class, got {targets}", "list every class as a target column and "
                  'name the train column holding the class as "label_column"')
        return
    if metric.kind not in _NUMBER_KINDS:
        return
    block = {}
    for c in targets:
        v = _floats(ans[c])
        if v is None or not np.isfinite(v).all():
            bad = [x for x in ans[c] if _floats([x]) is None][:5]
            rep.error(where, f"column {c!r} must hold numbers for {metric.name}"
                      + (f" (e.g. {_show(bad)})" if bad else " (NaN or infinite values)"),
                      "for class probabilities the answers are one-hot 0/1 per class column")
            return
        block[c] = v
    arr = np.stack([block[c] for c in targets], axis=1)
    if metric.kind in ("probability", "distribution") and not np.isin(arr, (0.0, 1.0)).all():
        rep.error(where, f"{metric.name} needs 0/1 answers in {targets}, got values like "
                  f"{_show(np.unique(arr[~np.isin(arr, (0.0, 1.0))]))}")
    elif metric.kind == "probability":
        for k, c in enumerate(targets):
            if len(np.unique(arr[:, k])) < 2:
                rep.error(where, f"column {c!r} holds one class only: {metric.name} needs "
                          "both 0 and 1 among the test answers")
    elif metric.kind == "nonnegative" and (arr < 0).any():
        rep.error(where, f"{metric.name} needs values >= 0, {int((arr < 0).sum())} are negative")
    elif metric.kind == "integer" and (np.abs(arr - np.round(arr)) > 1e-9).any():
        rep.error(where, f"{metric.name} needs integer ratings in {targets[0]!r}")
    if metric.kind == "distribution" and not np.allclose(arr.sum(axis=1), 1.0):
        rep.error(where, f"each answers row of {targets} must be one-hot (sum 1), "
                  f"{int((~np.isclose(arr.sum(axis=1), 1.0)).sum())} rows are not")


def _dry_run(task: Task, rep: _Report, max_prompt_tokens, libraries, count_tokens,
             warmstart: bool) -> None:
    """What a run does first, in a scratch directory: carve the reward split, grade the
    answers and the sample submission on both splits, render the solve prompt, and (for the
    warm start) write demonstration programs."""
    from rl4mle_jax.env import prompts
    from rl4mle_jax.env.grading import TaskError, grade
    from rl4mle_jax.run_config import PromptLimits

    # Scratch next to the real reward view: the same file system, so public files hard-link.
    near = task._reward_root().parent
    near.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".validate-", dir=near) as tmp:
        scratch = dataclasses.replace(task, reward_root=Path(tmp) / "reward", _ready=set())
        try:
            scratch.ensure_reward_split()
        except Exception as e:  # noqa: BLE001 - whatever the carve hits, named
            fix = ('add "label_column" to task.json (the train column holding the class)'
                   if "label column" in str(e) else "")
            rep.error("reward split", f"cannot be carved from public train: "
                      f"{type(e).__name__}: {str(e)[:300]}", fix)
            return
        rep.out.checked.append("reward split carved")
        for split in ("test", "reward"):
            try:
                # Host files (the task's own), graded as a user's CSV is: `grading.grade`.
                right = grade(scratch, scratch.answers_path(split), split)
                sample_p = scratch.sample_submission_path(split)
                sample = (grade(scratch, sample_p, split)
                          if sample_p is not None and sample_p.exists() else None)
            except (TaskError, OSError, ValueError) as e:
                rep.error(f"{split} split", f"the grader cannot use this task: {e}")
                continue
            if not right.valid:
                rep.error(f"{split} split", f"the answers themselves do not grade as a "
                          f"submission ({right.reason}: {right.message})",
                          "target columns must hold what a submission writes (one-hot 0/1 per "
                          "class for class probabilities)")
            elif sample is not None and not sample.valid:
                (rep.error if sample.reason == "metric_error" else rep.warn)(
                    f"{split} split: sample submission", f"does not grade ({sample.reason}: "
                    f"{sample.message})", "the agent copies the sample's format: make it a "
                    "valid submission (e.g. class probabilities that sum to 1)")
            else:
                rep.out.checked.append(f"{split} split grades (answers: {task.metric} = "
                                       f"{right.score:.4g})")
        if warmstart:
            _check_demos(scratch, rep)
        if libraries is None:
            libraries = tuple(sorted(prompts.probe_libraries(python=sys.executable)))
        _check_prompt(scratch, rep, max_prompt_tokens or PromptLimits().max_prompt_tokens,
                      libraries, count_tokens or prompts.approx_token_count)


def _check_demos(task: Task, rep: _Report) -> None:
    from rl4mle_jax.warmstart.demos import generate_programs

    try:
        progs = generate_programs(task, n=2)
    except Exception as e:  # noqa: BLE001 - whatever the generator hits, named
        rep.error("warm start", f"cannot write demonstration programs for this task "
                  f"({type(e).__name__}: {str(e)[:300]})", "give a checkpoint with "
                  "--config.model.hf_dir (no warm start), or make train/test plain tables")
        return
    if not progs:
        rep.error("warm start", "wrote no demonstration program for this task")
    else:
        rep.out.checked.append("warm-start demonstrations can be written")


def _check_prompt(task: Task, rep: _Report, budget: int, libraries, count) -> None:
    from rl4mle_jax.env import prompts

    cfg = prompts.PromptConfig(max_prompt_tokens=budget, system_prompt=None)
    try:
        ctx = prompts.task_context(task, libraries, "reward", cfg)
        prompt = prompts.solve_prompt(ctx, cfg=cfg, count_tokens=count)
    except ValueError as e:
        rep.error("prompt", str(e), f"raise --config.prompt.max_prompt_tokens (now {budget}), "
                  "or fewer/narrower public files")
        return
    cut = prompts.description_cut(ctx, prompt, count)
    if cut:
        total, kept, dropped = cut
        lines = [line for line in dropped.splitlines() if line.strip()]
        first = lines[0] if lines else ""
        rep.warn("description.md", f"~{total} tokens, the solve prompt keeps ~{kept} "
                 f"(max_prompt_tokens={budget}, the '## Submission...' section kept whole): "
                 f"{len(lines)} lines are cut, from {first[:80]!r}",
                 "shorten the description, or raise --config.prompt.max_prompt_tokens")
    rep.out.checked.append(f"solve prompt ~{prompt.n_tokens} of {budget} tokens")

