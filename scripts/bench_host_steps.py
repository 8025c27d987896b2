"""Seconds per host step on program text and output, at 16/64/256 KB, for ordinary inputs and
for the worst inputs of issue 9 (classes 3 and 4); prints a markdown table.

    .venv/bin/python scripts/bench_host_steps.py            # this tree only
    .venv/bin/python scripts/bench_host_steps.py --old REV  # also the implementation at REV

`--old` loads instrument*.py and reward.py's `parse_error` from `git show REV:...` into
temporary modules (default REV: the commit before `env/tracebacks.py` was added). An old step
that takes longer than `--cap-s` is stopped and shown as `>cap`; one that raises shows the
exception's name.
"""

from __future__ import annotations

import argparse
import importlib.util
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rl4mle_jax.env import instrument, instrument_lm, tracebacks  # noqa: E402

SIZES_KB = (16, 64, 256)
PROGRAM = '''import numpy as np
import pandas as pd
from sklearn.ensemble import RandomForestClassifier

train = pd.read_csv("input/train.csv")
test = pd.read_csv("input/test.csv")
X, y = train.drop(columns=["id", "target"]), train["target"]
model = RandomForestClassifier(n_estimators=200, random_state=0)
model.fit(X, y)
proba = model.predict_proba(test.drop(columns=["id"]))[:, 1]
pd.DataFrame({"id": test["id"], "target": proba}).to_csv("submission/submission.csv")
'''
TB = "Traceback (most recent call last):\n"


def _fill(unit: str, n: int) -> str:
    return unit * max(1, n // len(unit))


def _lm_answer(code: str, marker: str) -> str:
    lines = []
    for line in code.splitlines():
        lines += [line, marker] if ".fit(" in line or "read_csv" in line else [line]
    return "```python\n" + "\n".join(lines) + "\n```\n"


PROGRAMS = {  # name -> (ordinary?, make(n chars))
    "ordinary program": (True, lambda n: _fill(PROGRAM, n)),
    "n statements": (False, lambda n: _fill("m.fit(x)\n", n)),
    "one huge line": (False, lambda n: _fill("m.fit(x); ", n) + "\n"),
    "deep headers": (False, lambda n: _fill("for _ in f" + "()" * 900 + ": pass\n", n)),
    "nested writes": (False, lambda n: _fill("df.to_csv(" + "-" * 900 + "'s.csv')\n", n)),
    "a placement fails": (False, lambda n: "for _ in " + "(" * 199 + "read_csv(0)" + ")" * 199
                          + ": pass\n" + _fill("m.fit(x)\n", n - 500)),
    "compile error": (False, lambda n: _fill("m.fit(x)\n", n - 10) + "return 1\n"),
}
LM_ANSWERS = {
    "ordinary answer": lambda c: _lm_answer(c, 'print("@@MILESTONE model_trained")'),
    "spaced markers": lambda c: _lm_answer(c, 'print("@@MILESTONE' + " " * 200 + 'data loaded")'),
}
OUTPUTS = {
    "ordinary output": (True, lambda n: _fill("epoch 3 loss 0.4213\n@@MS " + "0" * 32
                                              + " model_trained\n", n)),
    "tag then a word": (False, lambda n: "@@MS " + "a" * n),
    "tags": (False, lambda n: "@@MS" * (n // 4)),
}
STDERR = {
    "ordinary traceback": (True, lambda n: _fill("warning: x\n", n - 300) + TB
                           + '  File "/w/main.py", line 9, in <module>\n    model.fit(X)\n'
                           + '  File "/usr/lib/sk.py", line 99, in fit\nValueError: bad\n'),
    "frames without quotes": (False, lambda n: TB + _fill('  File "x\n', n)),
    "one long Stop line": (False, lambda n: TB + "Stop" * (n // 4) + "!\n"),
}


# ---------------------------------------------------------------- old implementation
def _load_old(rev: str):
    """The steps (see `_steps`) as they were at `rev`."""
    tmp = Path(tempfile.mkdtemp(prefix="bench_old_"))
    renames = {"rl4mle_jax.env.instrument_static": "old_instrument_static",
               "rl4mle_jax.env.instrument import": "old_instrument import"}
    for name in ("instrument_static", "instrument", "instrument_lm", "reward"):
        src = subprocess.run(["git", "show", f"{rev}:rl4mle_jax/env/{name}.py"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
        if name != "reward":  # the old parse_error works on the new program objects
            for a, b in renames.items():
                src = src.replace(a, b)
        (tmp / f"old_{name}.py").write_text(src)
    sys.path.insert(0, str(tmp))
    mods = {}
    for name in ("instrument_static", "instrument", "instrument_lm", "reward"):
        spec = importlib.util.spec_from_file_location(f"old_{name}", tmp / f"old_{name}.py")
        mods[name] = importlib.util.module_from_spec(spec)
        sys.modules[f"old_{name}"] = mods[name]
        spec.loader.exec_module(mods[name])
    old = mods["instrument"]
    return (old.instrument_static, mods["instrument_lm"].verify_lm_instrumentation,
            mods["reward"].parse_error, old.scan_markers, old.strip_markers)


def _default_old() -> str:
    added = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--",
                            "rl4mle_jax/env/tracebacks.py"], cwd=ROOT, capture_output=True,
                           text=True).stdout.split()
    return f"{added[-1]}^" if added else "HEAD"


# ---------------------------------------------------------------- timing
class _Late(Exception):
    pass


def _alarm(signum, frame):
    raise _Late


def _seconds(step, arg, cap_s: float, repeats: int = 2) -> str:
    best = float("inf")
    for _ in range(repeats):
        signal.setitimer(signal.ITIMER_REAL, cap_s)
        t = time.perf_counter()
        try:
            step(arg)
        except _Late:
            return f">{cap_s:g}"
        except Exception as e:  # noqa: BLE001 - the old steps raise; the table says which
            return type(e).__name__
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        best = min(best, time.perf_counter() - t)
    return f"{best:.4f}"


def _ratio(a: str, b: str) -> str:
    try:
        return f"{float(b) / max(float(a), 1e-4):.1f}"
    except ValueError:
        return "-"


def _rows(steps, cap_s):
    for step_name, input_name, ordinary, step, make in steps:
        cells = [_seconds(step, make(kb * 1000), cap_s) for kb in SIZES_KB]
        yield [step_name, input_name, "ordinary" if ordinary else "worst", *cells,
               _ratio(cells[1], cells[2])]


def _steps(instrument_static, verify_lm, parse_error, scan_markers, strip_markers):
    nonce = instrument.new_nonce()
    out = []
    for name, (ordinary, make) in PROGRAMS.items():
        out.append(("instrument_static", name, ordinary, instrument_static, make))
    for name, answer in LM_ANSWERS.items():
        out.append(("LM verification", name, name.startswith("ordinary"),
                    lambda c, a=answer: verify_lm(c, a(c)), PROGRAMS["ordinary program"][1]))
    for name, (ordinary, make) in OUTPUTS.items():
        out.append(("scan_markers", name, ordinary, lambda s: scan_markers(s, nonce), make))
        out.append(("strip_markers", name, ordinary, strip_markers, make))
    prog = instrument.instrument_static(PROGRAM)
    for name, (ordinary, make) in STDERR.items():
        out.append(("parse_error", name, ordinary, lambda s: parse_error(s, prog), make))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", nargs="?", const="", default=None,
                    help="also time the implementation at this git revision")
    ap.add_argument("--cap-s", type=float, default=20.0, help="stop an old step after this")
    args = ap.parse_args()
    signal.signal(signal.SIGALRM, _alarm)
    kb = " | ".join(f"{k} KB" for k in SIZES_KB)
    print(f"| step | input | kind | {kb} | 64→256 |\n|---|---|---|" + "---|" * 4)
    new = _steps(instrument.instrument_static, instrument_lm.verify_lm_instrumentation,
                 tracebacks.parse_error, instrument.scan_markers, instrument.strip_markers)
    for row in _rows(new, cap_s=60.0):
        print("| " + " | ".join(row) + " |", flush=True)
    if args.old is not None:
        rev = args.old or _default_old()
        print(f"\nOld implementation ({rev}); '>{args.cap_s:g}' = stopped after that long:\n")
        print(f"| step | input | kind | {kb} | 64→256 |\n|---|---|---|" + "---|" * 4)
        for row in _rows(_steps(*_load_old(rev)), cap_s=args.cap_s):
            print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
