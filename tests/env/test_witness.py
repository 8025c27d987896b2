"""The witness: milestone evidence from audit/profile hooks, through the real bwrap sandbox.

Honest programs earn their milestones; programs that imitate them (own functions named fit,
fits in dead code or strings, constant predictions) do not; forging attempts are refused and
never add a milestone.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

import numpy as np
import pytest

from rl4mle_jax.env.sandbox import Sandbox
from rl4mle_jax.env.sandbox.launcher import parse_status
from rl4mle_jax.env.sandbox.witness import validate_evidence

HAVE_BWRAP = shutil.which("bwrap") is not None or os.path.exists("/usr/bin/bwrap")
pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandbox"),
              pytest.mark.skipif(not HAVE_BWRAP, reason="bubblewrap not installed")]

ALL = ["libraries_imported", "data_loaded", "model_defined", "model_trained",
       "predictions_made", "submission_written"]

HONEST = """
import pandas as pd
from sklearn.linear_model import LogisticRegression
tr = pd.read_csv("input/train.csv")
te = pd.read_csv("input/test.csv")
m = LogisticRegression().fit(tr[["x"]], tr.y)
p = m.predict_proba(te[["x"]])[:, 1]
pd.DataFrame({"id": te.id, "y": p}).to_csv("submission/submission.csv", index=False)
"""


@pytest.fixture(scope="module")
def input_dir(tmp_path_factory) -> Path:
    root = Path(tempfile.gettempdir()) / f"rl4mle_witness_{uuid.uuid4().hex[:8]}"
    root.mkdir()
    os.chmod(root, 0o755)
    (root / "train.csv").write_text("id,x,y\n" + "".join(f"{i},{i * 0.5},{i % 2}\n"
                                                        for i in range(40)))
    (root / "test.csv").write_text("id,x\n" + "".join(f"{i},{i * 0.5}\n" for i in range(40, 50)))
    for f in root.iterdir():
        os.chmod(f, 0o644)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def sb() -> Sandbox:
    return Sandbox(backend="bwrap", timeout_s=60)


def run(sb: Sandbox, code: str, input_dir: Path):
    res = sb.run(code, input_dir)
    try:
        assert res.evidence is not None, res.stderr[-2000:]
        return res
    finally:
        res.cleanup()


def test_honest_sklearn_program_earns_every_milestone(sb, input_dir):
    res = run(sb, HONEST, input_dir)
    ev = res.evidence
    assert res.status == "ok", res.stderr[-2000:]
    assert ev["verified"] and ev["forged_lines"] == 0 and ev["error"] is None
    assert ev["milestones"] == ALL
    assert "sklearn.LogisticRegression.fit" in ev["fits"]
    assert {"pandas", "sklearn"} <= set(ev["libraries"])
    assert set(ev["input_reads"]) == {"train.csv", "test.csv"}
    assert ev["refused"] == []


def test_own_functions_named_like_library_calls_earn_nothing(sb, input_dir):
    code = """
import pandas as pd
class Model:
    def __init__(self): pass
    def fit(self, X, y): return self
    def train(self, X, y): return self
    def predict(self, X): return [0.5] * 10
    def predict_proba(self, X): return [[0.5, 0.5]] * 10
def read_csv(p): return None
def train(m): return m.fit(None, None)
def to_csv(rows, p):
    with open("submission/submission.csv", "w") as f:
        f.write("id,y\\n" + "".join(f"{i},0.5\\n" for i in range(40, 50)))
read_csv("input/train.csv")
m = train(Model())
m.predict_proba(None); m.predict(None)
to_csv(None, None)
"""
    ev = run(sb, code, input_dir).evidence
    assert ev["verified"]
    for m in ("data_loaded", "model_defined", "model_trained", "predictions_made"):
        assert m not in ev["milestones"]
    assert "submission_written" in ev["milestones"] and ev["fits"] == []


def test_fit_in_dead_code_strings_and_comments_is_not_training(sb, input_dir):
    code = """
import pandas as pd
from sklearn.linear_model import LogisticRegression
te = pd.read_csv("input/test.csv")
s = f"{'LogisticRegression().fit(X, y)'}"  # model.fit(X, y); model.predict(X)
if False:
    LogisticRegression().fit(te[["x"]], te.id % 2)
def never(): return LogisticRegression().fit(te[["x"]], te.id % 2)
pd.DataFrame({"id": te.id, "y": 0.5}).to_csv("submission/submission.csv", index=False)
"""
    ev = run(sb, code, input_dir).evidence
    assert "model_trained" not in ev["milestones"] and ev["fits"] == []
    assert {"libraries_imported", "data_loaded", "submission_written"} <= set(ev["milestones"])


def test_transformer_fit_alone_is_not_training(sb, input_dir):
    code = """
import pandas as pd
from sklearn.preprocessing import StandardScaler
te = pd.read_csv("input/test.csv")
z = StandardScaler().fit(te[["x"]]).transform(te[["x"]])
pd.DataFrame({"id": te.id, "y": (z[:, 0] > 0) * 1.0}).to_csv(
    "submission/submission.csv", index=False)
"""
    ev = run(sb, code, input_dir).evidence
    assert ev["verified"] and "model_trained" not in ev["milestones"]
    assert "model_defined" not in ev["milestones"] and ev["fits"] == []


def test_torch_training_loop_is_training(sb, input_dir):
    code = """
import torch
net = torch.nn.Linear(1, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
x = torch.randn(16, 1)
for _ in range(3):
    opt.zero_grad()
    loss = ((net(x) - 2 * x) ** 2).mean()
    loss.backward()
    opt.step()
"""
    res = run(sb, code, input_dir)
    ev = res.evidence
    assert res.status == "ok", res.stderr[-2000:]
    assert ev["verified"]
    assert {"libraries_imported", "model_defined", "model_trained",
            "predictions_made"} <= set(ev["milestones"])
    assert any(f.startswith("torch.SGD.step") for f in ev["fits"])


FORGERIES = {
    "fd_flood": """
import os
for fd in range(3, 1024):
    for line in (b"1 1 m model_trained 00\\n", b"99 2 m model_trained " + b"0" * 64 + b"\\n"):
        try: os.write(fd, line)
        except OSError: pass
""",
    "setprofile": "import sys\nsys.setprofile(None)\n",
    "settrace": "import sys\nsys.settrace(lambda *a: None)\n",
    "gc_referrers": "import gc, sys\ngc.get_referrers(sys.audit)\n",
    "gc_objects": "import gc\ngc.get_objects()\n",
    "string_at": "import ctypes\nctypes.string_at(id(0), 8)\n",
    "from_address": "import ctypes\n(ctypes.c_char * 8).from_address(id(0))\n",
    "memmove": "import ctypes\nb = ctypes.create_string_buffer(8)\nctypes.memmove(b, id(0), 8)\n",
    "dlsym": "import ctypes\nctypes.CDLL(None).process_vm_readv\n",
    "proc_mem": "open('/proc/self/mem', 'rb')\n",
    "proc_maps_link": ("import os\nos.symlink('/proc/self/smaps', '/tmp/m')\n"
                       "open('/tmp/m').read()\n"),
    "proc_fd": "import os\nos.listdir('/proc/self/fd')\n",
    "dev_fd": "import os\nos.listdir('/dev/fd')\n",
    "dir_fd": "import os\nd = os.open('/proc', os.O_RDONLY)\nos.open('self/mem', 0, dir_fd=d)\n",
    "environ": "open('/proc/self/environ', 'rb').read()\n",
    "compile_as_library": (
        "import sklearn, os\np = os.path.dirname(sklearn.__file__) + '/base.py'\n"
        "exec(compile('def fit(self):\\n    pass', p, 'exec'))\n"),
    "code_replace": (
        "import sklearn\nc = (lambda self: 0).__code__\n"
        "c.replace(co_filename=sklearn.__file__, co_name='fit')\n"),
    "marshal": "import marshal\nmarshal.loads(marshal.dumps(1))\n",
    "frame_walk": """
import sys
f, found = sys._getframe(), []
while f is not None:
    found += [type(v).__name__ for v in f.f_locals.values()]
    f = f.f_back
assert not any("HMAC" in n or n == "function" for n in found), found
print("walked", len(found))
""",
    "getprofile": "import sys\nassert sys.getprofile() is None\nprint('hidden')\n",
}


def test_forgery_attempts_are_refused_and_forge_nothing(sb, input_dir):
    # one program per attempt would take a minute; run each attempt in its own try block
    body = "".join(
        f"try:\n    exec({code!r}, {{}})\n    print('ran', {name!r})\n"
        f"except Exception as e:\n    print('failed', {name!r}, type(e).__name__, e)\n"
        for name, code in FORGERIES.items())
    res = run(sb, body, input_dir)
    ev = res.evidence
    out = res.stdout
    for name in ("setprofile", "settrace", "gc_referrers", "gc_objects", "string_at",
                 "from_address", "dlsym", "proc_mem", "proc_maps_link", "proc_fd", "dev_fd",
                 "dir_fd", "environ", "compile_as_library", "code_replace", "marshal"):
        assert f"failed {name!r} PermissionError".replace("'", "") in out.replace("'", ""), (
            name, out[-3000:])
    assert "ran frame_walk" in out.replace("'", "") and "ran getprofile" in out.replace("'", "")
    assert ev["forged_lines"] > 0 and not ev["verified"]
    assert "model_trained" not in ev["milestones"] and ev["fits"] == []
    assert {"sys.setprofile", "sys.settrace", "gc.get_referrers", "gc.get_objects",
            "ctypes.string_at", "ctypes.cdata"} <= set(ev["refused"])  # the first 12 are kept


def test_traceback_still_names_the_program_and_its_line(sb, input_dir):
    res = run(sb, "import pandas\nx = 1\nraise ValueError('boom')\n", input_dir)
    assert res.status == "error"
    lines = [ln for ln in res.stderr.splitlines() if ln.strip().startswith("File ")]
    assert lines == ['  File "/workdir/main.py", line 3, in <module>'], res.stderr
    res = run(sb, "import json\njson.loads('{')\n", input_dir)
    assert 'File "/workdir/main.py", line 2, in <module>' in res.stderr
    assert "<frozen importlib" not in res.stderr and "<string>" not in res.stderr
    res = run(sb, "import sys\nprint(sys.argv, __name__, __file__, sys.path[0])\n", input_dir)
    assert res.stdout.strip() == "['main.py'] __main__ /workdir/main.py /workdir"
    res = run(sb, "x = (\n", input_dir)
    assert 'File "/workdir/main.py", line 1' in res.stderr and "SyntaxError" in res.stderr


def test_witness_off_and_status_validation(sb, input_dir):
    assert parse_status(b'{"exit_code": 0, "duration_s": 1, "maxrss_kb": 1}\n') == {
        "exit_code": 0, "duration_s": 1.0, "maxrss_kb": 1}
    assert parse_status(b'{"exit_code": 0, "duration_s": 1, "maxrss_kb": 1, "cpu_s": 0.5}')[
        "cpu_s"] == 0.5
    bad = b'{"exit_code": 0, "duration_s": 1, "maxrss_kb": 1, "evidence": {"witness": 1}}'
    assert "evidence" not in parse_status(bad)
    ok = {"witness": 1, "verified": True, "forged_lines": 0, "milestones": ["x" * 500] * 50,
          "libraries": [], "fits": [], "input_reads": [], "refused": [], "error": None}
    v = validate_evidence(ok)
    assert len(v["milestones"]) == 12 and len(v["milestones"][0]) == 96
    assert validate_evidence({**ok, "fits": [1]}) is None


def test_overhead_is_small(input_dir):
    """CPU seconds of the honest program with and without the witness, 7 interleaved pairs: the
    median of the pairs' ratios. CPU time (the launcher's wait4) keeps other processes' work out
    of each run (CI's wall-clock medians of 3 varied by 25% between runs of the same program),
    pairing keeps slow phases of the machine out of the ratio, and the median keeps one lucky
    run out of it (the ratio of the two minima once read 1.304x on CI, from a witness-off run
    20% faster than its four siblings, where the paired median was 1.15x); ~1.17x here (pandas
    + scikit-learn imports under the audit hook)."""
    from rl4mle_jax.env.sandbox import launcher

    sb = Sandbox(backend="bwrap", timeout_s=60)
    cpu: dict[bool, list[float]] = {True: [], False: []}
    wall: dict[bool, list[float]] = {True: [], False: []}
    orig = launcher.launcher_argv
    try:
        for _ in range(7):
            for w in (False, True):
                launcher_argv = (lambda *a, _w=w, **k: orig(*a, **k, witness=_w))
                sys.modules["rl4mle_jax.env.sandbox.bwrap"].launcher_argv = launcher_argv
                res = sb.run(HONEST, input_dir)
                res.cleanup()
                assert res.status == "ok" and (res.evidence is not None) == w
                assert res.cpu_s is not None and 0 < res.cpu_s < 4 * res.duration_s
                cpu[w].append(res.cpu_s)
                wall[w].append(res.duration_s)
    finally:
        sys.modules["rl4mle_jax.env.sandbox.bwrap"].launcher_argv = orig
    ratio = float(np.median(np.asarray(cpu[True]) / np.asarray(cpu[False])))
    wall_ratio = float(np.median(np.asarray(wall[True]) / np.asarray(wall[False])))
    print(f"witness overhead: {ratio:.3f}x CPU, {wall_ratio:.3f}x wall ({cpu}, {wall})")
    assert ratio < 1.3, cpu


def test_libraries_that_list_their_own_mappings_run_untouched(sb, input_dir):
    """threadpoolctl (KNN, KMeans) and torch read /proc/self/maps: an honest program using
    them must not trip the witness (a refusal voids every credit)."""
    code = HONEST.replace("from sklearn.linear_model import LogisticRegression",
                          "from sklearn.neighbors import KNeighborsClassifier\n"
                          "from threadpoolctl import threadpool_info\n"
                          "assert threadpool_info() is not None").replace(
        "LogisticRegression()", "KNeighborsClassifier(3)")
    res = run(sb, code, input_dir)
    ev = res.evidence
    assert res.status == "ok", res.stderr[-2000:]
    assert ev["verified"] and ev["refused"] == [], ev
    assert "model_trained" in ev["milestones"] and "predictions_made" in ev["milestones"]
