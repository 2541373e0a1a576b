# Every target creates .venv when it is missing and installs the project into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: demo demo-session test bench clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

demo: $(VENV)/.installed  ## configs/demo.yaml from scratch: DLRM on generated Criteo-shaped data
	rm -rf runs/demo
	$(VENV)/bin/sparseflow train configs/demo.yaml --out runs/demo

demo-session: $(VENV)/.installed  ## the Rec SDK-style Session script
	$(PY) examples/session_demo.py

# Two pytest-xdist workers (~13 min on 2 cores instead of ~20), each running a test file at a
# time, so that a file's module fixtures (its training runs) run once. TEST_WORKERS=0: one
# process.
TEST_WORKERS ?= 2
test: $(VENV)/.installed
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

bench: $(VENV)/.installed  ## each benchmark prints its table; add --write to record it in BENCHMARKS.md
	$(PY) benchmarks/bench_key_processing.py
	$(PY) benchmarks/bench_lazy_adam.py
	$(PY) benchmarks/bench_index_capacity.py
	$(PY) benchmarks/e2e.py

clean:
	rm -rf $(VENV) build *.egg-info
