"""The training loop itself on two JAX processes (localhost, 2 CPU devices each): process 0 runs
the loop, process 1 mirrors its learner operations (rl4mle_jax/spmd.py) over one learner mesh of
all four devices; then both resume from the checkpoint they wrote together."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.test_multihost import _free_port, _wait  # noqa: E402
from tests.test_train import _cli_flags, _records  # noqa: E402


def _run_both(warm_cache, workdir: Path, **overrides) -> list[str]:
    port = _free_port()
    flags = _cli_flags(warm_cache, **{"mesh.data": -1, "run.eval_samples": 1, **overrides})
    procs = []
    for i in range(2):
        env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
               "RL4MLE_COORDINATOR": f"localhost:{port}", "RL4MLE_NUM_PROCESSES": "2",
               "RL4MLE_PROCESS_ID": str(i)}
        procs.append(subprocess.Popen(
            [sys.executable, str(ROOT / "experiments" / "run.py"),
             f"--config={ROOT / 'configs' / 'task.py'}", f"--workdir={workdir}", *flags],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT))
    return _wait(procs, timeout_s=900)


@pytest.mark.slow
def test_the_loop_runs_across_two_processes_and_resumes(warm_cache, tmp_path):
    workdir = tmp_path / "run"
    # The warm-up compiles the train step before the clock on both processes (commands
    # "compile"), then one learner step over the four devices of the two processes.
    lead, follow = _run_both(warm_cache, workdir, **{"run.max_steps": 1, "run.warmup": True})
    assert [m["step"] for m in _records(workdir / "metrics.jsonl")] == [1]
    assert (workdir / "report.md").exists() and (workdir / "eval_final.json").exists()
    assert "process 1 follows process 0 (new run)" in follow
    done = follow.split("process 1: process 0 stopped (done); ")[1].splitlines()[0]
    assert "'train': 1" in done and "'save': 1" in done and "'compile': 0" not in done, follow
    assert "warm-up before the RL clock" in lead
    assert "1" in {p.name for p in (workdir / "checkpoints").iterdir()}
    # Resume: both processes restore the checkpoint they wrote together and take one more step.
    lead, follow = _run_both(warm_cache, workdir, **{"run.max_steps": 2, "run.warmup": False})
    assert [m["step"] for m in _records(workdir / "metrics.jsonl")] == [1, 2]
    assert "resumed from step 1" in lead and "process 1 follows process 0 (resumed at step 1)" \
        in follow
    assert "'train': 1, 'compile': 0, 'save': 1" in follow, follow[-3000:]
