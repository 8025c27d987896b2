"""Tasks: directories in MLE-bench layout, described by ``task.json``.

Two layouts load:

* ours (also hand-made): ``<root>/task.json``, ``description.md``, ``public/`` (train, test,
  sample submission, extra files), ``private/<answers_file>``.
* MLE-bench's prepared data: ``<root>/prepared/{public,private}``; the spec comes from
  ``<root>/task.json`` if present, else from ``rl4mle_jax.env.mlebench``.

Derived files (the reward view carved from public train) never go into a directory the user
made: a task prepared by us under the data root keeps its view in ``<root>/reward``; any other
directory (hand-made, MLE-bench) gets ``<data_root>/derived/<id>-<hash of its path>/reward``.
Every derived file is keyed by the content it was made from (`Task.fingerprint`).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rl4mle_jax.env.metrics import METRICS

SPLITS = ("reward", "test")
# Selection splits "select1", "select2", ...: more carves of public train like the reward split
# (the same share held out), whose held-out rows are the next blocks of the reward split's
# permutation: disjoint from the reward split's answers (and from each other while they fit),
# so the RL loop never trained on them; the best-of-N pick cross-checks its finalists there
# (`best_of_n`, `select_splits`, `datasets.splits.split_indices`).
SELECT_PREFIX = "select"
# Which carve of the selection splits a recorded selection run was made on: 1 held out with
# seed reward_seed + k (answers overlapping the reward split's by about its share), 2 the folds
# above. Records of another carve are not reused.
SELECT_CARVE = 2
DEFAULT_TIMEOUT_S = 300.0
REWARD_FRACTION = 0.2
REWARD_SEED = 0


class TaskSpecError(ValueError):
    """A task directory or task.json is malformed (message names the file and field)."""


def default_data_root() -> Path:
    """$RL4MLE_DATA, else ~/.cache/rl4mle_jax/tasks."""
    env = os.environ.get("RL4MLE_DATA")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "rl4mle_jax" / "tasks"


@dataclass
class Task:
    """One competition: where its files are and how it is scored."""

    id: str
    root: Path
    metric: str
    direction: str  # "higher" | "lower"
    id_column: str
    target_columns: list[str]
    answers_file: str = "answers.csv"  # relative to the private dir
    description: str = ""
    reference_scores: dict = field(default_factory=dict)  # {split: {name: score}}
    timeout_s: float = DEFAULT_TIMEOUT_S
    label_column: str | None = None  # train column whose one-hot gives target_columns
    train_file: str = "train.csv"
    test_file: str = "test.csv"
    sample_submission_file: str | None = "sample_submission.csv"
    layout: str = "rl4mle"  # "rl4mle" | "mlebench"
    reward_fraction: float = REWARD_FRACTION
    reward_seed: int = REWARD_SEED
    reward_root: Path | None = None  # where the reward view lives
    extra: dict = field(default_factory=dict)  # other task.json fields, kept verbatim
    # {split: standard error of a typical valid score there}, measured at run time where the
    # reward rescales (env.baselines.ensure_reference_se); never part of task.json.
    reference_se: dict = field(default_factory=dict, repr=False, compare=False)
    # the carved views made or verified in this process ("reward", "select<k>")
    _ready: set = field(default_factory=set, repr=False, compare=False)

    @property
    def public_dir(self) -> Path:
        return self.root / "prepared" / "public" if self.layout == "mlebench" else \
            self.root / "public"

    @property
    def private_dir(self) -> Path:
        return self.root / "prepared" / "private" if self.layout == "mlebench" else \
            self.root / "private"

    def _reward_root(self) -> Path:
        return self.reward_root if self.reward_root is not None else self.root / "reward"

    def fingerprint(self) -> dict[str, Any]:
        """What the task is, by content: sha256 of the spec, the description and every public
        file (the agent's view and the source of the reward split). Caches keyed by it (warm
        start, demonstrations, reward view) rebuild when any of them changes; `files` names
        which. The private answers are not in it: nothing derived from them is cached."""
        from rl4mle_jax.env.datasets.splits import sha256_file_cached

        spec = {k: v for k, v in self.to_spec().items() if k != "reference_scores"}
        files = {"task.json": hashlib.sha256(json.dumps(
            spec, sort_keys=True, default=str).encode()).hexdigest(),
            "description": hashlib.sha256(self.description.encode()).hexdigest()}
        base = self.public_dir
        for p in sorted(base.rglob("*")):
            if p.is_file():
                files["public/" + p.relative_to(base).as_posix()] = sha256_file_cached(p)
        public = {k: v for k, v in files.items() if k.startswith("public/")}
        return {"digest": _digest(files), "public_digest": _digest(public), "files": files}

    def _view_root(self, split: str) -> Path:
        """Where the carved view of `split` ("reward" or a selection split) lives: selection
        splits sit beside the reward view, so they follow it out of a user's directory."""
        k = select_index(split)
        return self._reward_root() if k is None else \
            self._reward_root().parent / f"{SELECT_PREFIX}{k}"

    def ensure_reward_split(self, split: str = "reward") -> Path:
        """Create (or verify) the reward view, or selection split k's (fold k of the reward
        split's permutation: answers disjoint from the reward split's); returns its root."""
        from rl4mle_jax.env.datasets.splits import carve_reward_split

        _check_split(split)
        if split == "test":
            raise ValueError("the test split is the task's own, not carved")
        out = self._view_root(split)
        carve_reward_split(public_dir=self.public_dir, out_dir=out, train_file=self.train_file,
                           test_file=self.test_file,
                           sample_submission_file=self.sample_submission_file,
                           id_column=self.id_column, target_columns=self.target_columns,
                           label_column=self.label_column, fraction=self.reward_fraction,
                           seed=self.reward_seed, fold=select_index(split) or 0,
                           source_sha256=self.fingerprint()["public_digest"])
        self._ready.add(split)
        return out

    def input_dir(self, split: str = "reward") -> Path:
        """Directory the agent's program sees as ./input for `split`."""
        _check_split(split)
        if split == "test":
            return self.public_dir
        if split not in self._ready:  # once per process: made, or verified against the sources
            self.ensure_reward_split(split)
        return self._view_root(split) / "public"

    def answers_path(self, split: str = "reward") -> Path:
        _check_split(split)
        if split == "test":
            return self.private_dir / self.answers_file
        self.input_dir(split)
        return self._view_root(split) / "private" / "answers.csv"

    def sample_submission_path(self, split: str = "reward") -> Path | None:
        if self.sample_submission_file is None:
            return None
        return self.input_dir(split) / self.sample_submission_file

    def verify(self) -> list[str]:
        """Files whose sha256 differs from ``checksums.json`` (empty when all match or when the
        directory records no checksums, e.g. MLE-bench's own layout)."""
        from rl4mle_jax.env.datasets.splits import verify_checksums

        sums_p = self.root / "checksums.json"
        if not sums_p.exists():
            return []
        return verify_checksums(self.root, json.loads(sums_p.read_text()))

    def to_spec(self) -> dict[str, Any]:
        """The task.json form of this task."""
        d = asdict(self)
        for k in ("root", "reward_root", "layout", "description", "extra", "_ready",
                  "reference_se"):
            d.pop(k)
        return {**self.extra, **d}


def _digest(files: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def select_index(split: str) -> int | None:
    """k of a selection split "select<k>" (k >= 1), else None."""
    rest = split[len(SELECT_PREFIX):] if split.startswith(SELECT_PREFIX) else ""
    return int(rest) if rest.isdigit() and int(rest) >= 1 and rest[0] != "0" else None


def select_splits(k: int) -> list[str]:
    """The first k selection splits: ["select1", ..., "select<k>"]."""
    return [f"{SELECT_PREFIX}{i}" for i in range(1, int(k) + 1)]


def _check_split(split: str) -> None:
    if split not in SPLITS and select_index(split) is None:
        raise ValueError(f"split must be one of {SPLITS} or a selection split "
                         f"{SELECT_PREFIX}<k> (k >= 1), got {split!r}")


_REQUIRED = {"id": str, "metric": str, "id_column": str, "target_columns": list}
KNOWN_FIELDS = ("id", "metric", "direction", "id_column", "target_columns", "label_column",
                "answers_file", "train_file", "test_file", "sample_submission_file",
                "reference_scores", "timeout_s", "reward_fraction", "reward_seed")
# Fields our own preparation writes (kept in Task.extra, never a typo).
RECORDED_FIELDS = ("title", "source", "data_sha256", "n_train", "n_test", "builder_version")


@dataclass(frozen=True)
class SpecProblem:
    """One problem of a task.json dict: the field, what is wrong, and what to write instead."""

    field: str
    message: str
    fix: str = ""
    severity: str = "error"  # "error" | "warning"


def spec_problems(spec: dict[str, Any]) -> list[SpecProblem]:
    """Every problem of a task.json dict that can be seen without its files (errors first)."""
    import difflib

    out: list[SpecProblem] = []

    def bad(name: str, message: str, fix: str = "") -> None:
        out.append(SpecProblem(name, message, fix))

    for name, typ in _REQUIRED.items():
        if name not in spec:
            bad(name, f"missing required field {name!r}", _FIELD_HELP[name])
        elif not isinstance(spec[name], typ):
            bad(name, f"field {name!r} must be a {typ.__name__}, got "
                f"{type(spec[name]).__name__}", _FIELD_HELP[name])
    metric = spec.get("metric")
    if isinstance(metric, str) and metric not in METRICS:
        near = difflib.get_close_matches(metric, list(METRICS), n=1)
        bad("metric", f"field 'metric' must be one of {sorted(METRICS)}, got {metric!r}",
            f"did you mean {near[0]!r}?" if near else _FIELD_HELP["metric"])
    targets = spec.get("target_columns")
    if isinstance(targets, list) and (not targets or not all(isinstance(t, str) and t
                                                             for t in targets)):
        bad("target_columns", f"field 'target_columns' must be a non-empty list of column "
            f"names, got {targets!r}", _FIELD_HELP["target_columns"])
    if isinstance(targets, list) and len(set(targets)) != len(targets):
        bad("target_columns", f"field 'target_columns' repeats a column: {targets!r}")
    if "direction" in spec:
        direction = spec["direction"]
        if direction not in ("higher", "lower"):
            bad("direction", f"field 'direction' must be 'higher' or 'lower', got "
                f"{direction!r}", "leave it out: the metric sets it")
        elif metric in METRICS and direction != METRICS[metric].direction:
            bad("direction", f"field 'direction' is {direction!r}, but {metric} is "
                f"{METRICS[metric].direction}-is-better", "leave 'direction' out: the metric "
                "sets it")
    timeout = spec.get("timeout_s", DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        bad("timeout_s", f"field 'timeout_s' must be a positive number, got {timeout!r}",
            f"seconds one program may run, e.g. {DEFAULT_TIMEOUT_S:g}")
    refs = spec.get("reference_scores", {})
    if not isinstance(refs, dict) or not all(
            isinstance(v, dict) and all(isinstance(x, (int, float)) for x in v.values())
            for v in refs.values()):
        bad("reference_scores", f"field 'reference_scores' must map split -> {{name: score}}, "
            f"got {refs!r}", 'e.g. {"test": {"baseline": 0.71, "strong": 0.78}}, or run '
            "`python -m rl4mle_jax.env calibrate DIR --write`")
    elif set(refs) - set(SPLITS):
        bad("reference_scores", f"field 'reference_scores' has splits {sorted(set(refs))}; "
            f"the splits are {list(SPLITS)}")
    fraction = spec.get("reward_fraction", REWARD_FRACTION)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) \
            or not 0 < fraction < 1:
        bad("reward_fraction", f"field 'reward_fraction' must be in (0, 1), got {fraction!r}",
            f"the share of public train held out as the reward split, e.g. {REWARD_FRACTION}")
    seed = spec.get("reward_seed", REWARD_SEED)
    if isinstance(seed, bool) or not isinstance(seed, int):
        bad("reward_seed", f"field 'reward_seed' must be an integer, got {seed!r}")
    for name in ("answers_file", "train_file", "test_file"):
        if name in spec and not (isinstance(spec[name], str) and spec[name]):
            bad(name, f"field {name!r} must be a file name, got {spec[name]!r}")
    for name in ("sample_submission_file", "label_column"):
        if spec.get(name) is not None and not (isinstance(spec[name], str) and spec[name]):
            bad(name, f"field {name!r} must be a name or null, got {spec[name]!r}")
    known = set(KNOWN_FIELDS) | set(RECORDED_FIELDS)
    for name in sorted(k for k in spec if k not in known):
        near = difflib.get_close_matches(name, KNOWN_FIELDS, n=1)
        out.append(SpecProblem(name, f"unknown field {name!r} (kept, but nothing reads it)",
                               f"did you mean {near[0]!r}?" if near else "", "warning"))
    return out


_FIELD_HELP = {
    "id": 'a short name, e.g. "id": "titanic-survival"',
    "metric": f"one of {sorted(METRICS)}",
    "id_column": 'the column that names each row in train, test, sample submission and '
                 'answers, e.g. "id_column": "PassengerId"',
    "target_columns": 'the columns a submission must fill, e.g. "target_columns": ["Survived"]'
                      '; for class probabilities one column per class, with "label_column" '
                      'naming the train column that holds the class',
}


def task_from_spec(spec: dict[str, Any], root: Path, *, layout: str, where: str) -> Task:
    """Validate a task.json dict (the first error raises, naming `where` and the field)."""
    errors = [p for p in spec_problems(spec) if p.severity == "error"]
    if errors:
        e = errors[0]
        raise TaskSpecError(f"{where}: {e.message}" + (f" ({e.fix})" if e.fix else ""))
    direction = spec.get("direction", METRICS[spec["metric"]].direction)
    return Task(id=spec["id"], root=root, metric=spec["metric"], direction=direction,
                id_column=spec["id_column"], target_columns=list(spec["target_columns"]),
                answers_file=spec.get("answers_file", "answers.csv"),
                reference_scores=spec.get("reference_scores", {}),
                timeout_s=float(spec.get("timeout_s", DEFAULT_TIMEOUT_S)),
                label_column=spec.get("label_column"),
                train_file=spec.get("train_file", "train.csv"),
                test_file=spec.get("test_file", "test.csv"),
                sample_submission_file=spec.get("sample_submission_file",
                                                "sample_submission.csv"),
                layout=layout,
                reward_fraction=float(spec.get("reward_fraction", REWARD_FRACTION)),
                reward_seed=int(spec.get("reward_seed", REWARD_SEED)),
                extra={k: v for k, v in spec.items() if k not in KNOWN_FIELDS})


def _discover(spec: dict[str, Any], public: Path, private: Path) -> dict[str, Any]:
    """Fill file names that the spec leaves out from what the directories contain."""
    spec = dict(spec)
    if "answers_file" not in spec:
        for name in ("answers.csv", "test.csv"):
            if (private / name).exists():
                spec["answers_file"] = name
                break
    if "sample_submission_file" not in spec:
        cands = sorted(p.name for p in public.glob("*.csv") if "sample" in p.name.lower()
                       and "submission" in p.name.lower())
        if cands:
            spec["sample_submission_file"] = ("sample_submission.csv"
                                              if "sample_submission.csv" in cands else cands[0])
    for key, stem in (("train_file", "train"), ("test_file", "test")):
        if key not in spec:
            for ext in (".csv", ".json"):
                if (public / f"{stem}{ext}").exists():
                    spec[key] = stem + ext
                    break
    return spec


def _check_files(task: Task, where: str) -> None:
    for d, what in ((task.public_dir, "public"), (task.private_dir, "private")):
        if not d.is_dir():
            raise TaskSpecError(f"{where}: {what} directory {d} does not exist")
    for name in (task.train_file, task.test_file):
        if not (task.public_dir / name).is_file():
            raise TaskSpecError(f"{where}: public file {task.public_dir / name} does not exist")
    if not (task.private_dir / task.answers_file).is_file():
        raise TaskSpecError(f"{where}: answers file {task.private_dir / task.answers_file} "
                            f"does not exist (field 'answers_file')")


def load_task_dir(path: Path, data_root: Path | None = None) -> Task:
    """Load a task directory in our layout or MLE-bench's prepared layout."""
    path = Path(path).expanduser().resolve()
    if path.name == "prepared" and (path / "public").is_dir():
        path = path.parent
    spec_file = path / "task.json"
    spec: dict[str, Any] | None = None
    if spec_file.exists():
        try:
            spec = json.loads(spec_file.read_text())
        except json.JSONDecodeError as e:
            raise TaskSpecError(f"{spec_file}: not valid JSON ({e})") from None
        if not isinstance(spec, dict):
            raise TaskSpecError(f"{spec_file}: must hold a JSON object")
    if (path / "prepared" / "public").is_dir():
        layout = "mlebench"
        public, private = path / "prepared" / "public", path / "prepared" / "private"
        if spec is None:
            from rl4mle_jax.env.mlebench import spec_for

            spec = spec_for(path.name, public)
            where = f"MLE-bench spec for {path.name!r} ({path})"
        else:
            where = str(spec_file)
    elif spec is not None:
        layout, public, private, where = "rl4mle", path / "public", path / "private", \
            str(spec_file)
    else:
        raise TaskSpecError(f"{path}: not a task directory (needs task.json with public/ and "
                            f"private/, or MLE-bench's prepared/public and prepared/private)")
    spec = _discover(spec, public, private)
    task = task_from_spec(spec, path, layout=layout, where=where)
    _check_files(task, where)
    for name in ("description.md",):
        for cand in (path / name, public / name):
            if cand.exists():
                task.description = cand.read_text()
                break
    root = Path(data_root or default_data_root()).expanduser().resolve()
    if layout == "mlebench" or not path.is_relative_to(root):
        task.reward_root = derived_dir(task.id, path, root) / "reward"
    return task


def derived_dir(task_id: str, path: Path, data_root: Path) -> Path:
    """Where files derived from the task directory `path` go (outside it)."""
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:10]
    return data_root / "derived" / f"{task_id}-{digest}"


def list_tasks() -> list[str]:
    """Ids of the local task suite (built from data inside installed packages)."""
    from rl4mle_jax.env.suite import local_task_ids

    return local_task_ids()


def prepare_task(task_id: str, data_root: str | Path | None = None, *, force: bool = False,
                 reference: str = "auto") -> Task:
    """Build a local task into the data root (idempotent; fast when checksums match).

    reference: "auto" (recorded scores if the data matches, else run the baselines),
      "recorded" (never run), "compute" (always run the baselines).
    """
    from rl4mle_jax.env.datasets import build_task

    root = Path(data_root).expanduser() if data_root else default_data_root()
    return build_task(task_id, root, force=force, reference=reference)


def load_task(path_or_id: str | Path, data_root: str | Path | None = None) -> Task:
    """Load a task by directory path, or by id (local suite: prepared on first use; MLE-bench
    ids: ``~/.cache/mle-bench/data/<id>`` or ``$MLEBENCH_DATA/<id>``)."""
    root = Path(data_root).expanduser() if data_root else default_data_root()
    p = Path(path_or_id).expanduser()
    if p.exists():
        return load_task_dir(p, data_root=root)
    name = str(path_or_id)
    from rl4mle_jax.env.suite import LOCATIONS

    if name in LOCATIONS:
        return prepare_task(name, root)
    if (root / name / "task.json").exists():
        return load_task_dir(root / name, data_root=root)
    from rl4mle_jax.env.mlebench import SPECS, mlebench_data_root

    if name in SPECS:
        cand = mlebench_data_root() / name
        if cand.exists():
            return load_task_dir(cand, data_root=root)
        raise TaskSpecError(f"MLE-bench task {name!r} is not prepared at {cand}; run MLE-bench's "
                            f"`mlebench prepare -c {name}` or pass the directory path")
    raise TaskSpecError(f"unknown task {name!r}: not a directory, not a local task "
                        f"({', '.join(sorted(LOCATIONS))}), not an MLE-bench spec")
