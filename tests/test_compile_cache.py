"""The entry points' persistent compilation cache: a second process loads what the first
compiled; "off" leaves JAX's setting alone."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_PROGRAM = """
import json, sys
import jax, jax.numpy as jnp
from rl4mle_jax import compile_cache
hits = []
jax.monitoring.register_event_listener(
    lambda event, **_: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None)
d = compile_cache.enable(sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # this tiny program too
f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum())
f(jnp.ones((8, 8))).block_until_ready()
print(json.dumps({"dir": str(d) if d else None, "hits": len(hits),
                  "setting": jax.config.jax_compilation_cache_dir}))
"""


def _run(arg):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", _PROGRAM, arg], capture_output=True, text=True,
                         env=env, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_loads_from_the_cache(tmp_path):
    first = _run(str(tmp_path / "cache"))
    assert first["dir"] == str(tmp_path / "cache") and first["hits"] == 0
    assert any((tmp_path / "cache").iterdir())  # the program was written
    assert _run(str(tmp_path / "cache"))["hits"] >= 1


def test_off_leaves_the_cache_off():
    out = _run("off")
    assert out["dir"] is None and out["setting"] in (None, "")
