# Every target sets up .venv itself, so on a fresh machine with only python3
# `make demo` and `make test` are the whole set-up.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv demo test test-core test-mpi test-stress bench results lint clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,dev,mpi,plot]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) examples/parameter_server.py

test: $(STAMP)
	$(PY) -m pytest -q

test-core: $(STAMP)
	$(PY) -m pytest -q tests/core

# The transport contract on MPI at N processes (`make test` runs it at 2 and 4).
N ?= 2
test-mpi: $(STAMP)
	$(VENV)/bin/mpiexec -n $(N) $(PY) -m tests.transports.mpi_contract_runner

# Many more randomized cancellation programs than `make test` runs, in-process and on MPI.
STRESS ?= 2000
test-stress: $(STAMP)
	ASYNCCOMM_STRESS_EXAMPLES=$(STRESS) $(PY) -m pytest -q --timeout 3600 \
		tests/transports/test_conservation.py
	ASYNCCOMM_STRESS_EXAMPLES=$(STRESS) $(VENV)/bin/mpiexec -n 2 $(PY) -m \
		tests.transports.mpi_conservation_runner

# Every benchmark runs; the target fails (non-zero) if any of them missed a target.
bench: $(STAMP)
	@status=0; \
	$(PY) -m benchmarks || status=1; \
	$(PY) -m benchmarks.cluster || status=1; \
	$(PY) -m benchmarks.collectives || status=1; \
	$(VENV)/bin/mpiexec -n 2 $(PY) -m benchmarks.mpi_p2p || status=1; \
	$(VENV)/bin/mpiexec -n 2 $(PY) -m benchmarks.mpi_ring || status=1; \
	$(VENV)/bin/mpiexec -n 3 $(PY) -m benchmarks.mpi_ring || status=1; \
	$(VENV)/bin/mpiexec -n 4 $(PY) -m benchmarks.mpi_ring || status=1; \
	if [ $$status -ne 0 ]; then echo "make bench: some targets were missed (see FAIL above)"; fi; \
	exit $$status

# The tables, JSON and pictures under docs/ that answer the source article's claims.
results: $(STAMP)
	$(PY) -m results

lint: $(STAMP)
	$(PY) -m ruff check asynccomm tests examples benchmarks results
	$(PY) -m mypy

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
