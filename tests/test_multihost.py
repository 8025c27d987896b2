"""Two JAX processes on localhost (4 CPU devices each) train exactly like one process with 8:
the same metrics and parameters after two PPO steps, and a checkpoint written by both processes
restores to the trained state."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "multihost_check.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _start(out, num_processes, process_id, devices, port):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), "--num_processes", str(num_processes), "--process_id",
         str(process_id), "--devices", str(devices), "--coordinator", f"localhost:{port}",
         "--out", str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)


def _wait(procs, timeout_s: float = 600) -> list[str]:
    """Each process's output, once every one has exited 0 (all killed on a timeout)."""
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("multihost check timed out")
        assert p.returncode == 0, out[-3000:]
        outs.append(out)
    return outs


@pytest.mark.slow
def test_two_processes_train_like_one(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    port = _free_port()
    _wait([_start(two, 2, i, 4, port) for i in range(2)])
    _wait([_start(one, 1, 0, 8, port)])
    a, b = (json.loads((d / "result.json").read_text()) for d in (one, two))
    assert (a["processes"], a["devices"], a["local_devices"]) == (1, 8, 8)
    assert (b["processes"], b["devices"], b["local_devices"]) == (2, 8, 4)
    assert a["restored_equals_trained"] and b["restored_equals_trained"]
    for ma, mb in zip(a["metrics"], b["metrics"], strict=True):
        assert ma.keys() == mb.keys()
        for k in ma:
            np.testing.assert_allclose(mb[k], ma[k], rtol=1e-4, atol=2e-5, err_msg=k)
    pa, pb = np.load(one / "result.npz"), np.load(two / "result.npz")
    assert sorted(pa.files) == sorted(pb.files) and len(pa.files) > 5
    for k in pa.files:
        np.testing.assert_allclose(pb[k], pa[k], rtol=1e-4, atol=2e-5, err_msg=k)
