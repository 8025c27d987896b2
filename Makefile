# `make run` and `make test` each do the whole set-up on a fresh machine (venv at .venv).
PY := .venv/bin/python
PIP := .venv/bin/pip

.PHONY: setup run test lint bench

.venv/.installed: setup.py constraints.txt
	python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e ".[test,docker,ray]"
	touch .venv/.installed

setup: .venv/.installed
	@command -v bwrap >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq bubblewrap; \
	  else sudo apt-get update -qq && sudo apt-get install -y -qq bubblewrap; fi; }

run: setup
	$(PY) experiments/run.py --config configs/task.py

test: setup
	.venv/bin/ruff check .
	$(PY) -m pytest -q --durations=25 tests

lint: setup
	.venv/bin/ruff check .

bench: setup
	$(PY) scripts/bench_sampler.py
	$(PY) scripts/bench_sandbox.py
