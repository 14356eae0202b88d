# The two commands of README: `make demo` and `make test`. Both create or reuse .venv.
# The install step re-runs only when pyproject.toml or constraints.txt change (the stamp file).

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.preheat-installed
# A CUDA build of torch: make demo TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
# (on a fresh .venv; see README, "GPU").
TORCH_INDEX_URL ?=

.PHONY: demo test test-fast lint install serve

# The eviction policies, compiled with mypyc where a C compiler is at hand and rebuilt when their
# source changes; where the build fails they run as plain Python (cache_runtime/compiled.py,
# whose MODULES a test holds equal to this list).
POLICIES := $(addprefix cache_runtime/,key_queue.py policies.py prefix_policies.py queue_policies.py tinylfu.py shadows.py handover.py selector.py following.py pool.py)
COMPILED := $(VENV)/.preheat-compiled

install: $(COMPILED)

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else "Preheat needs Python 3.11; set PYTHON=/path/to/python3.11")'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# torch first, pinned by constraints.txt, so no other package can pull a different build
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt \
		$(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL) --extra-index-url https://pypi.org/simple) \
		torch==2.13.0
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[dev]"
	@touch $(STAMP)

$(COMPILED): $(STAMP) $(POLICIES)
	$(BIN)/python cache_runtime/compiled.py
	@touch $(COMPILED)

demo: $(COMPILED)
	$(BIN)/preheat demo

# Prefect server + worker + deployments with schedules + MLflow UI + Redis on 127.0.0.1; Ctrl-C stops.
serve: $(COMPILED)
	$(BIN)/preheat serve

# Two workers, one test file each at a time: most of the suite waits on the servers its tests
# start (Redis, Prefect, MLflow, gateways), so a second file runs meanwhile; module fixtures
# stay within one worker.
test: $(COMPILED)
	$(BIN)/python -m pytest -n 2 --dist loadfile

# The edit-test loop: unit tests without the `slow` and `integration` ones. CI runs `make test`.
test-fast: $(COMPILED)
	$(BIN)/python -m pytest -n 2 --dist loadfile tests/unit -m "not slow and not integration"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
