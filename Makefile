# `make run` and `make test` each do the whole set-up on a fresh machine (venv at .venv).
PY := .venv/bin/python
PIP := .venv/bin/pip

.PHONY: setup run test lint bench

.venv/.installed: setup.py constraints.txt
	python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e ".[test,docker,ray]"
	touch .venv/.installed

# System packages: bubblewrap (the sandbox; required) and tcmalloc (the host's allocator: XLA:CPU's
# train step ran 1.4-2.8x faster than under glibc malloc here, rl4mle_jax/allocator.py; optional).
APT := $(if $(filter 0,$(shell id -u)),,sudo) apt-get

setup: .venv/.installed
	@command -v bwrap >/dev/null || { $(APT) update -qq && $(APT) install -y -qq bubblewrap; }
	@$(PY) -m rl4mle_jax.allocator --check || { $(APT) update -qq && \
	  $(APT) install -y -qq libtcmalloc-minimal4; } || \
	  echo "tcmalloc not installed: glibc malloc, a slower train step (rl4mle_jax/allocator.py)"

run: setup
	$(PY) experiments/run.py --config configs/task.py

# The suite runs under the allocator the entry points pick (RL4MLE_MALLOC; glibc when none).
test: setup
	.venv/bin/ruff check .
	LD_PRELOAD="$$($(PY) -m rl4mle_jax.allocator)" $(PY) -m pytest -q --durations=25 tests

lint: setup
	.venv/bin/ruff check .

bench: setup
	$(PY) scripts/bench_sampler.py
	$(PY) scripts/bench_sandbox.py
