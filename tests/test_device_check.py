"""scripts/device_check.sh (the accelerator check) does not rot: its CPU variant runs here."""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_device_check_runs_on_cpu():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run(["bash", str(ROOT / "scripts" / "device_check.sh"), "--cpu_shapes"],
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    table = [line for line in out.stdout.splitlines() if line.startswith("|")]
    assert len(table) >= 4, out.stdout[-3000:]  # header, rule, and rows
    assert "skipped" not in out.stdout and "error" not in out.stdout.lower(), out.stdout
