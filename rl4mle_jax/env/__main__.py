"""Command line of the environment; every command prints JSON.

    python -m rl4mle_jax.env list
    python -m rl4mle_jax.env prepare [--all | ID ...] [--force] [--reference auto|recorded|compute]
    python -m rl4mle_jax.env grade --task ID|DIR --submission FILE [--split reward|test]
    python -m rl4mle_jax.env run --task ID|DIR SCRIPT.py [--split ...] [--timeout S]
        [--instrument static]   (adds milestone markers; the reward record is printed either
                                 way; exit 0 only when the reward rules call the run valid)
    python -m rl4mle_jax.env calibrate [--all | ID ...] [--write]

Global: --data-root DIR (default $RL4MLE_DATA or ~/.cache/rl4mle_jax/tasks).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from rl4mle_jax.env.grading import grade, invalid_report
from rl4mle_jax.env.metrics import METRICS
from rl4mle_jax.env.tasks import Task, TaskSpecError, default_data_root, list_tasks, load_task


def _print(obj: Any) -> None:
    print(json.dumps(obj, indent=1, default=str))


# --- run: the one run-and-grade step (env/execute.py) ----------------------------------------

def run_program(task: Task, code: str, split: str = "reward", timeout_s: float | None = None,
                sandbox: Any = None, instrument: str = "none") -> dict:
    """Execute `code` in the sandbox on `split`, grade it, score it; a JSON-ready dict.

    instrument: "none" runs the program as given; "static" adds milestone markers. Either way
    the reward record (with the witness's evidence) is reported.
    """
    from rl4mle_jax.env.execute import run_and_grade
    from rl4mle_jax.env.instrument_lm import Instrumenter
    from rl4mle_jax.env.submission import RUN_SUBMISSION

    if instrument not in ("none", "static"):
        raise ValueError(f"--instrument must be 'none' or 'static', got {instrument!r}")
    if sandbox is None:
        from rl4mle_jax.env.sandbox import Sandbox

        sandbox = Sandbox()
    # "none": no markers, but the static training check still sees the code.
    run = run_and_grade(code, task, sandbox, split=split, instrumenter=Instrumenter(instrument),
                        timeout_s=timeout_s or task.timeout_s)
    out = {"task": task.id, "split": split, **run.to_dict()}
    if out["grade"] is None:  # nothing at the submission path
        out["grade"] = invalid_report(task, split, RUN_SUBMISSION, "no_file",
                                      f"no {RUN_SUBMISSION} was written").to_dict()
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
        raise SystemExit("give task ids or --all")
    return args.ids


def _cmd_prepare(args: argparse.Namespace) -> int:
    from rl4mle_jax.env.tasks import prepare_task

    out = []
    for tid in _ids(args):
        t0 = time.monotonic()
        task = prepare_task(tid, args.data_root, force=args.force, reference=args.reference)
        out.append(dict(id=task.id, root=str(task.root), metric=task.metric,
                        reference_scores=task.reference_scores,
                        seconds=round(time.monotonic() - t0, 2)))
    _print(out)
    return 0


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
    p.add_argument("--backend", default="bwrap", choices=["bwrap", "subprocess", "docker"])
    p.add_argument("--instrument", default="none", choices=["none", "static"],
                   help="insert milestone markers (static analysis); the reward record is "
                        "printed either way")


def _cmd_run(args: argparse.Namespace) -> int:
    from rl4mle_jax.env.sandbox import Sandbox

    task = load_task(args.task, data_root=args.data_root)
    sandbox = Sandbox(backend=args.backend)
    out = run_program(task, args.script.read_text(), split=args.split, timeout_s=args.timeout,
                      sandbox=sandbox, instrument=args.instrument)
    _print(out)
    return 0 if out["reward"]["status"] == "valid" else 1  # graded valid and really trained


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from rl4mle_jax.env.baselines import measure_reference
    from rl4mle_jax.env.datasets import reference_scores
    from rl4mle_jax.env.tasks import prepare_task

    recorded = dict(reference_scores.RECORDED)
    out = {}
    for tid in _ids(args):
        task = prepare_task(tid, args.data_root, reference="recorded")
        digest = json.loads((task.root / "task.json").read_text())["data_sha256"]
        m = measure_reference(task)
        recorded[tid] = dict(data_sha256=digest, **m["scores"], runtime_s=m["runtime_s"])
        out[tid] = recorded[tid]
        # Make the freshly measured scores the prepared task's own.
        spec = json.loads((task.root / "task.json").read_text())
        spec["reference_scores"] = m["scores"]
        (task.root / "task.json").write_text(json.dumps(spec, indent=1))
    if args.write:
        path = Path(reference_scores.__file__)
        head = path.read_text().split("RECORDED", 1)[0]
        # JSON of str/float/dict is a valid Python literal (and stays under the line limit).
        body = json.dumps(recorded, indent=1, sort_keys=True)
        path.write_text(f"{head}RECORDED: dict = {body}\n")
    _print(out)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m rl4mle_jax.env", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-root", type=Path, default=None)
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="local tasks")
    for name, helptext in (("prepare", "build local tasks"),
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
                           help="update rl4mle_jax/env/datasets/reference_scores.py")
    p = sub.add_parser("grade", help="grade a submission file")
    p.add_argument("--task", required=True)
    p.add_argument("--submission", required=True, type=Path)
    p.add_argument("--split", default="reward", choices=["reward", "test"])
    add_run_arguments(sub.add_parser("run", help="run a program in the sandbox and grade it"))
    return ap


COMMANDS = {"list": _cmd_list, "prepare": _cmd_prepare, "grade": _cmd_grade, "run": _cmd_run,
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
