# Fresh machine: `make test` and `make bench` create .venv, install the pinned
# dependencies (constraints.txt pins torch==2.13.0, the CPU wheel) and run. `make bench`
# and `make paper` need only the base dependencies; `make test` (and `make venv`) add the
# extras the tests exercise (pytest, Lightning, transformers, TensorBoard). --no-compile:
# pip would byte-compile all ~14,500 installed modules (about 80 s of CPU for torch and the
# base dependencies alone); instead Python compiles the few hundred a command imports, once,
# and caches them, which it may only do with PYTHONDONTWRITEBYTECODE unset (empty), as here.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
PIP := $(BIN)/python -m pip install --quiet --no-compile -c constraints.txt
export PYTHONDONTWRITEBYTECODE :=
SUITE ?= default
# parallel workers of `make bench` (empty: one per core); the numbers do not depend on it
WORKERS ?=

.PHONY: venv test bench paper overhead lint clean

venv: $(TEST_STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --no-compile --upgrade "pip>=24"
	$(PIP) torch==2.13.0 -e .
	touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(PIP) -e ".[dev,lightning,transformers,tensorboard]"
	touch $(TEST_STAMP)

# Packages held to ruff (pycodestyle, pyflakes, bugbear, pyupgrade, isort, pydocstyle with the
# numpy convention) and mypy; both are configured in pyproject.toml.
LINTED := neuraldbg causal_models

lint: $(TEST_STAMP)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/mypy $(LINTED)

test: $(TEST_STAMP)
	$(BIN)/python -m pytest -q

# the default suite's run ends by regenerating papers/report.md, so report and paper agree
bench: $(STAMP)
	$(BIN)/python -m benchmarks --suite $(SUITE) $(if $(WORKERS),--workers $(WORKERS))
	if [ "$(SUITE)" = default ]; then $(MAKE) --no-print-directory paper; fi

overhead: $(STAMP)
	$(BIN)/python -m benchmarks.overhead

paper: $(STAMP)
	$(BIN)/python -m papers.build

clean:
	rm -rf $(VENV) results .pytest_cache
