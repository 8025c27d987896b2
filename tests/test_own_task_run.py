"""The main job on a user's task directory through `--config.task=DIR` alone, and a changed
task rebuilding its warm start (the cache is keyed by the task's content)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]

# A small warm start: enough to exercise the path, not to learn.
WARMSTART = {"demos_per_task": 3, "improve_pairs_per_task": 2, "instrument_pairs_per_task": 1,
             "steps": 6, "eval_samples": 2, "eval_max_new_tokens": 64, "eval_instrument": 0,
             "code_corpus_bytes": 100_000, "vocab_size": 1024}
QUICK = {"mesh.data": 1, "run.max_steps": 1, "run.batch_size": 2, "run.slots": 2,
         "run.eval_samples": 0, "run.time_budget_s": 0.0, "run.progress": False,
         "instrument.max_new_tokens": 64, "prompt.max_response_tokens": 256}


def _run(task_dir, workdir, cache, data):
    cmd = [sys.executable, str(ROOT / "experiments" / "run.py"),
           "--config", str(ROOT / "configs" / "task.py"), "--workdir", str(workdir),
           f"--config.task={task_dir}", f"--config.data_root={data}",
           f"--config.warmstart.cache_dir={cache}",
           *[f"--config.{k}={v}" for k, v in QUICK.items()],
           *[f"--config.warmstart.settings.{k}={v!r}" for k, v in WARMSTART.items()]]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)


def _make_task(root):
    from sklearn.datasets import load_breast_cancer

    from rl4mle_jax.env.newtask import new_task

    df = load_breast_cancer(as_frame=True).frame.rename(columns={"target": "malignant"})
    df.columns = [c.replace(" ", "_") for c in df.columns]
    src = root.parent / "cancer.csv"
    df.to_csv(src, index=False)
    new_task(root, metric="auc", id_column="id", targets=["malignant"], source=src)


def test_main_job_on_a_task_directory_and_a_changed_task_rebuilds(tmp_path):
    task_dir, cache, data = tmp_path / "my-cancer", tmp_path / "warm", tmp_path / "data"
    _make_task(task_dir)
    first = _run(task_dir, tmp_path / "run1", cache, data)
    assert first.returncode == 0, first.stderr[-4000:]
    summary = json.loads(first.stdout[first.stdout.index("{"):])
    assert Path(summary["workdir"]).name == "run1"
    metrics = [json.loads(x) for x in
               (tmp_path / "run1" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1]
    episodes = [json.loads(x) for x in
                (tmp_path / "run1" / "experience.jsonl").read_text().splitlines()]
    graded = [e["record"]["grade"] for e in episodes
              if not e.get("cancelled") and e["record"].get("grade")]
    assert all(g["task_id"] == "my-cancer" and g["metric"] == "auc" for g in graded)
    # No reference scores in its task.json: its generated solutions' are measured and used.
    assert "my-cancer has no reference scores in its task.json" in first.stderr
    assert all(set(g["reference_scores"]) == {"baseline", "strong"} for g in graded)
    report = (tmp_path / "run1" / "report.md").read_text()
    assert "| reward | " in report and "no reference scores" not in report, report
    assert "reference_scores" not in json.loads((task_dir / "task.json").read_text())
    (built,) = [p for p in cache.iterdir() if p.name.startswith("warmstart-")]
    stats = json.loads((built / "stats.json").read_text())
    assert "public/train.csv" in stats["task_files"]["my-cancer"]
    assert not (task_dir / "reward").exists()  # derived files live under the data root

    # The same id, other rows: the warm start is rebuilt, and the log says which files changed.
    train = pd.read_csv(task_dir / "public" / "train.csv")
    train.iloc[:-20].to_csv(task_dir / "public" / "train.csv", index=False)
    second = _run(task_dir, tmp_path / "run2", cache, data)
    assert second.returncode == 0, second.stderr[-4000:]
    assert "warm start: cached" not in second.stderr
    assert f"task 'my-cancer' changed since {built.name} (public/train.csv)" in second.stderr
    assert len([p for p in cache.iterdir() if p.name.startswith("warmstart-")]) == 2


def test_a_task_that_does_not_validate_stops_before_any_work(tmp_path):
    task_dir = tmp_path / "broken"
    _make_task(task_dir)
    spec = json.loads((task_dir / "task.json").read_text())
    spec["metric"] = "log_loss"  # one 0/1 column: not class probabilities
    (task_dir / "task.json").write_text(json.dumps(spec))
    done = _run(task_dir, tmp_path / "run", tmp_path / "warm", tmp_path / "data")
    assert done.returncode != 0
    assert "does not validate" in done.stderr and "field 'target_columns'" in done.stderr
    assert not (tmp_path / "warm").exists() or not any((tmp_path / "warm").iterdir())
