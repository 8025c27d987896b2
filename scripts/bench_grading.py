"""Host cost of grading the worst submissions a sandboxed program can leave behind.

Each case is graded by ``grade_run`` in a fresh interpreter, so its peak RSS (VmHWM, which
exec resets; ``ru_maxrss`` would also count the parent's pages from before the exec) is that
case's alone; a child that only imports the grader gives the baseline. "grading's own MB" is
the rise of VmHWM over VmRSS just before grading (the high-water mark is reset through
``/proc/self/clear_refs`` once the task is loaded).

Two tasks: a real local one (answers of ~1 k rows, so its caps are small) and a synthetic
one whose 60 k answer rows put the byte cap at its 64 MiB ceiling.

    python scripts/bench_grading.py                      # telco-churn, reward split
    python scripts/bench_grading.py --task mnist --split test
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

TARGET_S, TARGET_MB = 2.0, 300.0


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _child(task_dir: str, data_root: str, split: str, workdir: str | None) -> None:
    from rl4mle_jax.env.grading import grade_run

    if workdir is None:  # baseline: imports only
        print(json.dumps({"reason": "-", "seconds": 0.0, "peak_mb": _status_mb("VmHWM")}))
        return
    from rl4mle_jax.env.tasks import load_task

    task = load_task(task_dir, data_root=data_root)
    gc.collect()
    load_peak = _status_mb("VmHWM")
    try:  # reset VmHWM, so the grading phase's own peak can be read afterwards
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    before = _status_mb("VmRSS")
    t0 = time.perf_counter()
    rep = grade_run(task, workdir, split)
    dt = time.perf_counter() - t0
    hwm = _status_mb("VmHWM")
    print(json.dumps({"reason": rep.reason or f"valid ({rep.score:.4g})", "seconds": dt,
                      "peak_mb": max(load_peak, hwm), "grade_mb": hwm - before}))


def _measure(task_dir: Path, data_root: Path, split: str, workdir: Path | None) -> dict:
    """One fresh interpreter per case; its VmHWM (reset at exec) is the case's alone."""
    cmd = [sys.executable, __file__, "--child", str(task_dir), str(data_root), split,
           str(workdir) if workdir else "-"]
    p = subprocess.run(cmd, capture_output=True, timeout=120)
    if p.returncode != 0:
        return {"reason": f"CRASH rc={p.returncode}: {p.stderr.decode()[-300:]}",
                "seconds": float("nan"), "peak_mb": float("nan")}
    return json.loads(p.stdout)


def _run_dir(root: Path, name: str) -> tuple[Path, Path]:
    wd = root / name
    (wd / "submission").mkdir(parents=True)
    return wd, wd / "submission" / "submission.csv"


def _fill(path: Path, head: bytes, unit: bytes, size: int) -> None:
    with open(path, "wb") as f:
        f.write(head)
        f.write(unit * max(0, (size - len(head)) // len(unit)))


def build_cases(task, split: str, root: Path) -> dict[str, Path]:
    """One run directory per hostile (or valid) submission."""
    from rl4mle_jax.env.submission import submission_bounds

    b = submission_bounds(task, split)
    ans = pd.read_csv(task.answers_path(split))
    cols = [task.id_column, *task.target_columns]
    header = (",".join(cols) + "\n").encode()
    cases: dict[str, Path] = {}

    def case(name):
        wd, p = _run_dir(root, name)
        cases[name] = wd
        return wd, p

    _, p = case("valid submission")
    sub = ans[cols].copy()
    for c in task.target_columns:
        if pd.api.types.is_numeric_dtype(sub[c]):
            sub[c] = sub[c].astype(float) * 0.9 + 0.05
    sub.to_csv(p, index=False)
    _, p = case("symlink -> answers")
    os.symlink(task.answers_path(split), p)
    wd, _ = case("submission/ -> private dir")
    (wd / "submission").rmdir()
    os.symlink(Path(task.answers_path(split)).parent, wd / "submission")
    _, p = case("FIFO")
    os.mkfifo(p)
    _, p = case(f"sparse at the cap ({b.max_bytes >> 10} KiB)")
    p.write_bytes(header)
    os.truncate(p, b.max_bytes)
    _, p = case("sparse 1 GiB")
    p.write_bytes(header)
    os.truncate(p, 1 << 30)
    _, p = case("1.5 M short rows")
    _fill(p, header, b"1\n", len(header) + 3_000_000)
    _, p = case("short rows up to the cap")
    _fill(p, header, b"1,0\n", b.max_bytes)
    _, p = case("max rows of max-length cells")
    cell = "9" * (b.max_cell_chars - 1)
    row = ",".join([cell] * len(cols)) + "\n"
    n = min(b.max_rows, b.max_bytes // len(row) - 1)
    p.write_text(",".join(cols) + "\n" + row * n)
    _, p = case("100 k columns")
    p.write_text(",".join(f"c{i}" for i in range(100_000)) + "\n")
    _, p = case("one 60 MiB line")
    _fill(p, header, b"x" * 1024, 60 << 20)
    _, p = case("one line at the cap")
    _fill(p, header, b"x" * 1024, b.max_bytes)
    _, p = case("deep quoting at the cap")
    _fill(p, header, b'"' * 1024, b.max_bytes)
    _, p = case("quoted newlines, one record")
    _fill(p, header, b'"\n",', b.max_bytes)
    return cases


def synthetic_task(root: Path, n_test: int = 60_000):
    """A task with n_test answer rows (AUC, one target): its byte cap is at the ceiling."""
    from rl4mle_jax.env.tasks import load_task

    rng = np.random.default_rng(0)
    d = root / "synthetic-60k"
    (d / "public").mkdir(parents=True)
    (d / "private").mkdir()
    n_train = 2_000
    ids = np.arange(n_train + n_test)
    y = rng.integers(0, 2, n_train + n_test)
    x = rng.normal(size=n_train + n_test)
    pd.DataFrame({"id": ids[:n_train], "x": x[:n_train], "flag": y[:n_train]}).to_csv(
        d / "public" / "train.csv", index=False)
    pd.DataFrame({"id": ids[n_train:], "x": x[n_train:]}).to_csv(d / "public" / "test.csv",
                                                                 index=False)
    pd.DataFrame({"id": ids[n_train:], "flag": 0.5}).to_csv(
        d / "public" / "sample_submission.csv", index=False)
    pd.DataFrame({"id": ids[n_train:], "flag": y[n_train:]}).to_csv(
        d / "private" / "answers.csv", index=False)
    (d / "description.md").write_text("# synthetic\n")
    (d / "task.json").write_text(json.dumps(dict(id=d.name, metric="auc", id_column="id",
                                                 target_columns=["flag"])))
    return load_task(d, data_root=root / "data")


def bench(task, split: str, data_root: Path, tmp: Path) -> list[str]:
    from rl4mle_jax.env.submission import submission_bounds

    b = submission_bounds(task, split)
    cases = build_cases(task, split, tmp / f"runs-{task.id}")
    base = _measure(task.root, data_root, split, None)
    lines = [f"\n**{task.id}** ({split} split: {b.expected_rows} answer rows; caps: "
             f"{b.max_bytes / 2**20:.1f} MiB, {b.max_rows} rows, {b.max_columns} columns, "
             f"{b.max_cell_chars} chars a cell); import-only child: {base['peak_mb']:.0f} MB\n",
             "| case | reason | seconds | peak RSS MB | grading's own MB |",
             "|---|---|---:|---:|---:|"]
    worst_s = worst_mb = 0.0
    for name, wd in cases.items():
        r = _measure(task.root, data_root, split, wd)
        worst_s, worst_mb = max(worst_s, r["seconds"]), max(worst_mb, r["peak_mb"])
        lines.append(f"| {name} | {r['reason']} | {r['seconds']:.3f} | {r['peak_mb']:.0f} | "
                     f"{r.get('grade_mb', float('nan')):+.0f} |")
    ok = worst_s <= TARGET_S and worst_mb <= TARGET_MB
    lines.append(f"\nworst: {worst_s:.2f} s, {worst_mb:.0f} MB "
                 f"({'within' if ok else 'OVER'} {TARGET_S:g} s / {TARGET_MB:g} MB)")
    return lines


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        task_dir, data_root, split, wd = sys.argv[2:6]
        _child(task_dir, data_root, split, None if wd == "-" else wd)
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="telco-churn", help="local task id")
    ap.add_argument("--split", default="reward", choices=["reward", "test"])
    ap.add_argument("--no-synthetic", action="store_true", help="skip the 60 k-row task")
    args = ap.parse_args()
    from rl4mle_jax.env.tasks import prepare_task

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data_root = tmp / "data"
        task = prepare_task(args.task, data_root, reference="recorded")
        out = bench(task, args.split, data_root, tmp)
        if not args.no_synthetic:
            out += bench(synthetic_task(tmp), "test", data_root, tmp)
    print("\n".join(out))


if __name__ == "__main__":
    main()
