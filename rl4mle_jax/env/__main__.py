"""Command line of the environment; every command prints JSON.

    python -m rl4mle_jax.env list
    python -m rl4mle_jax.env new DIR --metric M --id-column ID (--target COL ... |
        --label-column COL) [--from data.csv [--test-fraction 0.2] [--seed 0]] [--id NAME]
                                (writes task.json, and with --from the whole directory)
    python -m rl4mle_jax.env validate ID|DIR [--max-prompt-tokens N]
                                (every problem named; exit 1 on errors)
    python -m rl4mle_jax.env prepare [--all | ID|DIR ...] [--force]
        [--reference auto|recorded|compute]   (a DIR: validated, its reward view made)
    python -m rl4mle_jax.env grade --task ID|DIR --submission FILE [--split reward|test]
    python -m rl4mle_jax.env run --task ID|DIR SCRIPT.py [--split ...] [--timeout S]
        [--instrument static]   (adds milestone markers; the reward record is printed either
                                 way; exit 0 only when the reward rules call the run valid)
        [--keep DIR]            (DIR must be missing or empty: it gets submission.csv, the
                                 graded bytes; stdout.txt, stderr.txt; program.py, as executed;
                                 record.json. The run dir itself is always deleted, so without
                                 --keep exec.submission_path and exec.workdir are null)
    python -m rl4mle_jax.env calibrate [--all | ID|DIR ...] [--write]
                                (a DIR without baseline scripts gets the generated simple and
                                 strong solutions; --write stores the scores in its task.json)

Global: --data-root DIR (default $RL4MLE_DATA or ~/.cache/rl4mle_jax/tasks).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from rl4mle_jax.env.grading import grade, invalid_report
from rl4mle_jax.env.metrics import METRICS
from rl4mle_jax.env.sandbox import BACKENDS
from rl4mle_jax.env.tasks import Task, TaskSpecError, default_data_root, list_tasks, load_task


def _print(obj: Any) -> None:
    print(json.dumps(obj, indent=1, default=str))


# --- run: the one run-and-grade step (env/execute.py) ----------------------------------------

def run_program(task: Task, code: str, split: str = "reward", timeout_s: float | None = None,
                sandbox: Any = None, instrument: str = "none", keep: Path | None = None) -> dict:
    """Execute `code` in the sandbox on `split`, grade it, score it; a JSON-ready dict.

    instrument: "none" runs the program as given; "static" adds milestone markers. Either way
    the reward record (with the witness's evidence) is reported.
    keep: a missing or empty directory that receives submission.csv (the graded bytes, absent
      when none could be read safely), stdout.txt, stderr.txt, program.py (as executed) and
      record.json; exec.submission_path then names the kept copy. The sandbox's run dir is
      deleted before this returns, so exec.workdir is always null and, without `keep`,
      exec.submission_path too. Raises FileExistsError for a non-empty `keep`, before running.
    """
    from rl4mle_jax.env.execute import run_and_grade
    from rl4mle_jax.env.instrument_lm import Instrumenter
    from rl4mle_jax.env.submission import RUN_SUBMISSION

    if instrument not in ("none", "static"):
        raise ValueError(f"--instrument must be 'none' or 'static', got {instrument!r}")
    if keep is not None:
        keep = keep.expanduser().absolute()
        keep.mkdir(parents=True, exist_ok=True)  # a file there raises FileExistsError
        if any(keep.iterdir()):  # never mix two runs' files, never overwrite
            raise FileExistsError(f"--keep {keep} is not empty; give a new or empty directory")
    if sandbox is None:
        from rl4mle_jax.env.sandbox import Sandbox

        sandbox = Sandbox()
    # "none": no markers, but the static training check still sees the code.
    run = run_and_grade(code, task, sandbox, split=split, instrumenter=Instrumenter(instrument),
                        timeout_s=timeout_s or task.timeout_s, keep_submission=keep is not None)
    out = {"task": task.id, "split": split, **run.to_dict()}
    if out["grade"] is None:  # nothing at the submission path
        out["grade"] = invalid_report(task, split, RUN_SUBMISSION, "no_file",
                                      f"no {RUN_SUBMISSION} was written").to_dict()
    ex = out["exec"] or {}
    ex["workdir"] = ex["submission_path"] = None  # deleted by run_and_grade
    out["kept"] = None
    if keep is None:
        return out
    # The graded bytes from memory (the run dir is gone, and its files were the program's);
    # O_EXCL|O_NOFOLLOW: nothing already at a name is followed or overwritten.
    files = {"stdout.txt": ex.get("stdout", "").encode(),
             "stderr.txt": ex.get("stderr", "").encode()}
    if run.submission is not None:
        files["submission.csv"] = run.submission
        ex["submission_path"] = str(keep / "submission.csv")
    if run.program is not None and run.nonce is not None:
        files["program.py"] = run.program.render(run.nonce).encode()
    out["kept"] = {"dir": str(keep), "files": sorted([*files, "record.json"])}
    files["record.json"] = json.dumps(out, indent=1, default=str).encode()
    for name, data in files.items():
        fd = os.open(keep / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    return out


# --- commands ---------------------------------------------------------------------------------

def _cmd_list(args: argparse.Namespace) -> int:
    from rl4mle_jax.env.datasets import REGISTRY

    rows = []
    for tid in list_tasks():
        d = REGISTRY[tid]
        spec_p = args.data_root / tid / "task.json"
        rows.append(dict(id=tid, title=d.title, metric=d.metric,
                         direction=METRICS[d.metric].direction, source=d.source,
                         prepared=spec_p.exists()))
    _print(rows)
    return 0


def _ids(args: argparse.Namespace) -> list[str]:
    if args.all:
        return list_tasks()
    if not args.ids:
        raise SystemExit("give task ids or directories, or --all")
    return args.ids


def _is_dir(name: str) -> bool:
    return Path(name).expanduser().is_dir()


def _cmd_prepare(args: argparse.Namespace) -> int:
    from rl4mle_jax.env.tasks import prepare_task
    from rl4mle_jax.env.validate import validate_task

    out, status = [], 0
    for tid in _ids(args):
        t0 = time.monotonic()
        row: dict[str, Any] = {}
        if _is_dir(tid):  # the user's directory: validated, then its reward view made
            check = validate_task(tid, data_root=args.data_root)
            row["validation"] = check.to_dict()
            if not check.ok:
                out.append({"id": check.task_id, "root": check.path, **row})
                status = 1
                continue
            task = load_task(tid, data_root=args.data_root)
            task.ensure_reward_split()
        else:
            task = prepare_task(tid, args.data_root, force=args.force, reference=args.reference)
        out.append(dict(id=task.id, root=str(task.root), metric=task.metric,
                        reward_view=str(task.input_dir("reward").parent),
                        reference_scores=task.reference_scores,
                        seconds=round(time.monotonic() - t0, 2), **row))
    _print(out)
    return status


def _cmd_validate(args: argparse.Namespace) -> int:
    from rl4mle_jax.env.validate import validate_task

    check = validate_task(args.task, data_root=args.data_root,
                          max_prompt_tokens=args.max_prompt_tokens)
    _print(check.to_dict())
    return 0 if check.ok else 1


def _cmd_new(args: argparse.Namespace) -> int:
    from rl4mle_jax.env.newtask import new_task
    from rl4mle_jax.env.validate import validate_task

    made = new_task(args.dir, metric=args.metric, id_column=args.id_column,
                    targets=args.target, label_column=args.label_column, source=args.source,
                    task_id=args.id, test_fraction=args.test_fraction, seed=args.seed,
                    force=args.force)
    check = validate_task(made["dir"], data_root=args.data_root)
    _print({**made, "validation": check.to_dict()})
    return 0 if check.ok else 1


def _cmd_grade(args: argparse.Namespace) -> int:
    task = load_task(args.task, data_root=args.data_root)
    report = grade(task, args.submission, split=args.split)
    _print(report.to_dict())
    return 0 if report.valid else 1


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", required=True, help="task id or directory")
    p.add_argument("script", type=Path, help="Python program to run")
    p.add_argument("--split", default="reward", choices=["reward", "test"])
    p.add_argument("--timeout", type=float, default=None, help="seconds (default: the task's)")
    p.add_argument("--backend", default="bwrap", choices=list(BACKENDS),
                   help="ray: through a Ray cluster ($RAY_ADDRESS, else a local one)")
    p.add_argument("--instrument", default="none", choices=["none", "static"],
                   help="insert milestone markers (static analysis); the reward record is "
                        "printed either way")
    p.add_argument("--keep", type=Path, default=None, metavar="DIR",
                   help="missing or empty directory to keep the graded submission, stdout, "
                        "stderr, executed program and record in (the run dir is deleted)")


def _cmd_run(args: argparse.Namespace) -> int:
    from rl4mle_jax.env.sandbox import Sandbox

    task = load_task(args.task, data_root=args.data_root)
    sandbox = Sandbox(backend=args.backend)
    try:
        out = run_program(task, args.script.read_text(), split=args.split,
                          timeout_s=args.timeout, sandbox=sandbox, instrument=args.instrument,
                          keep=args.keep)
    except FileExistsError as e:  # --keep names a non-empty directory, or a file
        _print({"error": type(e).__name__, "message": str(e)})
        return 2
    _print(out)
    return 0 if out["reward"]["status"] == "valid" else 1  # graded valid and really trained


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from rl4mle_jax.env.baselines import measure_reference
    from rl4mle_jax.env.datasets import reference_scores
    from rl4mle_jax.env.tasks import prepare_task

    recorded = dict(reference_scores.RECORDED)
    out = {}
    for tid in _ids(args):
        if _is_dir(tid):  # the user's task: its own task.json holds the scale
            task = load_task(tid, data_root=args.data_root)
            m = measure_reference(task)
            out[task.id] = dict(**m["scores"], runtime_s=m["runtime_s"])
            if args.write:
                _write_spec(task.root / "task.json", task, reference_scores=m["scores"])
            continue
        task = prepare_task(tid, args.data_root, reference="recorded")
        digest = json.loads((task.root / "task.json").read_text())["data_sha256"]
        m = measure_reference(task)
        recorded[tid] = dict(data_sha256=digest, **m["scores"], runtime_s=m["runtime_s"])
        out[tid] = recorded[tid]
        # Make the freshly measured scores the prepared task's own.
        _write_spec(task.root / "task.json", task, reference_scores=m["scores"])
    if args.write and any(not _is_dir(t) for t in _ids(args)):
        path = Path(reference_scores.__file__)
        head = path.read_text().split("RECORDED", 1)[0]
        # JSON of str/float/dict is a valid Python literal (and stays under the line limit).
        body = json.dumps(recorded, indent=1, sort_keys=True)
        path.write_text(f"{head}RECORDED: dict = {body}\n")
    _print(out)
    return 0


def _write_spec(path: Path, task: Task, **fields: Any) -> None:
    """Update fields of a task.json atomically (the rest, and its order, kept); an MLE-bench
    directory without one gets the task.json of its built-in spec."""
    spec = json.loads(path.read_text()) if path.exists() else task.to_spec()
    spec.update(fields)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(spec, indent=1) + "\n")
    os.replace(tmp, path)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m rl4mle_jax.env", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-root", type=Path, default=None)
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="local tasks")
    p = sub.add_parser("new", help="write task.json (and with --from the whole task) from CSVs")
    p.add_argument("dir", type=Path)
    p.add_argument("--metric", required=True, choices=sorted(METRICS))
    p.add_argument("--id-column", required=True, help="column naming each row (with --from: "
                   "created, numbering the rows, if the CSV has none)")
    p.add_argument("--target", nargs="+", default=None, help="target column(s) a submission "
                   "fills; for class probabilities the class names (default: the labels of "
                   "--label-column)")
    p.add_argument("--label-column", default=None, help="train column holding the class "
                   "(class probabilities: one target column per class)")
    p.add_argument("--from", dest="source", type=Path, default=None, help="one labelled CSV "
                   "to split into public train/test and private answers")
    p.add_argument("--id", default=None, help="task id (default: the directory's name)")
    p.add_argument("--test-fraction", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="replace an existing task.json / files")
    p = sub.add_parser("validate", help="check a task directory (or id) before any work")
    p.add_argument("task")
    p.add_argument("--max-prompt-tokens", type=int, default=None,
                   help="the prompt budget to check against (default: the embedded default's)")
    for name, helptext in (("prepare", "build local tasks / validate a task directory"),
                           ("calibrate", "measure reference scores by running baselines")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("ids", nargs="*")
        p.add_argument("--all", action="store_true")
        if name == "prepare":
            p.add_argument("--force", action="store_true")
            p.add_argument("--reference", default="auto",
                           choices=["auto", "recorded", "compute"])
        else:
            p.add_argument("--write", action="store_true",
                           help="store the scores: a DIR in its task.json, a local task in "
                                "rl4mle_jax/env/datasets/reference_scores.py")
    p = sub.add_parser("grade", help="grade a submission file")
    p.add_argument("--task", required=True)
    p.add_argument("--submission", required=True, type=Path)
    p.add_argument("--split", default="reward", choices=["reward", "test"])
    add_run_arguments(sub.add_parser("run", help="run a program in the sandbox and grade it"))
    return ap


COMMANDS = {"list": _cmd_list, "new": _cmd_new, "validate": _cmd_validate,
            "prepare": _cmd_prepare, "grade": _cmd_grade, "run": _cmd_run,
            "calibrate": _cmd_calibrate}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.data_root = (args.data_root or default_data_root()).expanduser()
    try:
        return COMMANDS[args.command](args)
    except (TaskSpecError, FileNotFoundError) as e:
        _print({"error": type(e).__name__, "message": str(e)})
        return 2


if __name__ == "__main__":
    sys.exit(main())
