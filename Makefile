# Every target sets up .venv itself, so on a fresh machine with only python3
# `make demo` and `make test` are the whole set-up.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv demo test test-core test-mpi test-stress test-crash-points test-fault-plans bench results lint clean

# A .venv whose python is missing, broken, or of another version than $(PYTHON) (made by
# another Python, say) is removed, and set up again by the target that needs it: its
# stamps would otherwise say it is set up. Versions are compared as major.minor, what the
# C extension is built for.
PY_VERSION = $(shell $(1) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
WANT_VERSION := $(call PY_VERSION,$(PYTHON))
ifneq ($(wildcard $(VENV)),)
ifneq ($(WANT_VERSION),)
VENV_VERSION := $(call PY_VERSION,$(PY))
ifneq ($(VENV_VERSION),$(WANT_VERSION))
$(info $(VENV) has $(if $(VENV_VERSION),Python $(VENV_VERSION),no working python), \
	$(PYTHON) is $(WANT_VERSION): removing $(VENV) to set it up again)
$(shell rm -rf $(VENV))
endif
endif
endif

# The runtime alone (what `make demo` needs), then everything the suite and tools need.
# PIP_QUIET and PYTHONWARNINGS keep set-up to pip's own errors (setuptools' editable-install
# banner is a warning printed by the build backend).
RUNTIME := $(VENV)/.runtime
PIP := PIP_QUIET=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONWARNINGS=ignore $(PY) -m pip
QUIET := grep -iv -e "editable" -e "careful" -e "precedence" -e "\*\*\*" -e "!!" \
	-e "with strategy" -e "is ignored: it is neither" -e "^\s*$$" || true

# setup.py builds the optional C extension (asynccomm/_native/_lane*.c, one module) where a
# compiler is.
$(RUNTIME): pyproject.toml setup.py $(wildcard asynccomm/_native/*.c asynccomm/_native/*.h)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PIP) install --upgrade pip 2>&1 | $(QUIET)
	@$(PIP) install -e . 2>&1 | $(QUIET)
	@$(PY) -c "import asynccomm" && touch $(RUNTIME) && echo "set up $(VENV) (runtime)"

$(STAMP): $(RUNTIME)
	@$(PIP) install -e '.[test,dev,mpi,plot]' 2>&1 | $(QUIET)
	@$(PY) -c "import pytest, mpi4py, hypothesis" && touch $(STAMP) && echo "set up $(VENV) (tests, tools, MPI)"

venv: $(STAMP)

demo: $(RUNTIME)
	$(PY) examples/parameter_server.py

# The whole suite, then the in-process engine, transport and cancellation tests again on
# the pure-Python fast lane (what runs where the C accelerator could not be built), but for
# those of the C lane or that compare it with the Python steps (marked native).
PURE_TESTS := tests/engine tests/api/test_bad_input.py tests/transports/test_local.py \
	tests/transports/test_conservation.py tests/core/test_fastlane.py tests/api/test_logging.py \
	tests/api/test_send_buffers.py tests/faults/test_contract.py
# The whole suite on two pytest-xdist workers, a test file to each at a time (its module
# fixtures, such as the shared mpiexec jobs of tests/transports/test_mpi.py, run once); then
# the pure-Python pass the same way (1,700 tests: 20 s on two workers, 28 s on one).
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile
	ASYNCCOMM_PURE_PYTHON=1 $(PY) -m pytest -q -p no:cacheprovider -m "not native" -n 2 \
		--dist loadfile $(PURE_TESTS)

test-core: $(STAMP)
	$(PY) -m pytest -q tests/core

# The transport contract under mpiexec at N processes: shared memory within the host, or
# MPI alone with ASYNCCOMM_TRANSPORT=mpi, or two fake hosts with ASYNCCOMM_TEST_HOSTS=a,a,b,b
# (`make test` runs it at 2, 3 and 4, one of each).
N ?= 2
test-mpi: $(STAMP)
	$(VENV)/bin/mpiexec -n $(N) $(PY) -m tests.transports.mpi_contract_runner

# Many more randomized programs than `make test` runs (cancellation and conservation of
# point-to-point; collectives, groups and objects with a misbehaving rank), in-process and
# on MPI.
STRESS ?= 2000
test-stress: $(STAMP)
	ASYNCCOMM_STRESS_EXAMPLES=$(STRESS) $(PY) -m pytest -q --timeout 3600 \
		tests/transports/test_conservation.py tests/engine/test_objects_programs.py \
		tests/collectives/test_adversity.py tests/transports/test_shm.py \
		tests/transports/test_shm_offer.py tests/faults/test_processes.py
	ASYNCCOMM_STRESS_EXAMPLES=$(STRESS) $(VENV)/bin/mpiexec -n 2 $(PY) -m \
		tests.transports.mpi_conservation_runner
	ASYNCCOMM_STRESS_EXAMPLES=$(STRESS) $(VENV)/bin/mpiexec -n 2 $(PY) -m \
		tests.engine.mpi_objects_runner
	for n in 2 3 4; do $(VENV)/bin/mpiexec -n $$n $(PY) -m \
		tests.collectives.mpi_adversity_runner --examples $(STRESS) || exit 1; done

# A rank crashing at every engine event of 24 small programs on 2-8 modelled ranks, by
# fault plan, survived (`make test` runs a sample of them); prints the counts.
test-crash-points: $(STAMP)
	ASYNCCOMM_CRASH_POINTS=all $(PY) -m pytest -q tests/faults/test_crash_points.py
	ASYNCCOMM_CRASH_POINTS=all $(PY) -m tests.faults.test_crash_points

# Random seeded fault plans (link delays, jitter, bandwidth, partitions; a crash, hang or
# slowdown) on random programs of the cluster model (`make test` runs 40): two processes,
# each with its own seed and half the plans.
PLANS ?= 10000
test-fault-plans: $(STAMP)
	@start=$$(date +%s); pids=""; \
	for s in 1 2; do \
		ASYNCCOMM_FAULT_PLANS=$$(( $(PLANS) / 2 )) ASYNCCOMM_FAULT_PLANS_SEED=$$s \
		$(PY) -m pytest -q -p no:cacheprovider --timeout 3600 -m fault_plans \
			tests/faults/test_random_plans.py & pids="$$pids $$!"; \
	done; status=0; for p in $$pids; do wait $$p || status=1; done; \
	echo "make test-fault-plans: $(PLANS) plans in $$(( $$(date +%s) - start )) s"; \
	exit $$status

# Every benchmark runs, then benchmarks.report writes docs/performance.md from the JSON they
# wrote (old JSON is removed first, so a benchmark that fails cannot leave last run's figures
# on the page); the target fails (non-zero) if any of them missed a target.
bench: $(STAMP)
	@status=0; \
	rm -f benchmarks/results/*.json; \
	$(PY) -m benchmarks || status=1; \
	$(PY) -m benchmarks.instructions || status=1; \
	$(PY) -m benchmarks.cluster || status=1; \
	$(PY) -m benchmarks.collectives || status=1; \
	$(PY) -m benchmarks.cpu_state mpi_p2p || status=1; \
	$(VENV)/bin/mpiexec -n 2 $(PY) -m benchmarks.mpi_p2p || status=1; \
	$(PY) -m benchmarks.cpu_state mpi_ring_n2 || status=1; \
	$(VENV)/bin/mpiexec -n 2 $(PY) -m benchmarks.mpi_ring || status=1; \
	$(PY) -m benchmarks.cpu_state mpi_ring_n3 || status=1; \
	$(VENV)/bin/mpiexec -n 3 $(PY) -m benchmarks.mpi_ring || status=1; \
	$(PY) -m benchmarks.cpu_state mpi_ring_n4 || status=1; \
	$(VENV)/bin/mpiexec -n 4 $(PY) -m benchmarks.mpi_ring || status=1; \
	$(PY) -m benchmarks.cpu_state shm_p2p_n2 || status=1; \
	$(VENV)/bin/mpiexec -n 2 $(PY) -m benchmarks.shm_p2p || status=1; \
	$(PY) -m benchmarks.cpu_state shm_p2p_n3 || status=1; \
	$(VENV)/bin/mpiexec -n 3 $(PY) -m benchmarks.shm_p2p || status=1; \
	$(PY) -m benchmarks.cpu_state shm_p2p_n4 || status=1; \
	$(VENV)/bin/mpiexec -n 4 $(PY) -m benchmarks.shm_p2p || status=1; \
	$(VENV)/bin/mpiexec -n 4 $(PY) -m benchmarks.hybrid || status=1; \
	$(PY) -m benchmarks.ps_ceiling || status=1; \
	$(PY) -m benchmarks.report || status=1; \
	if [ $$status -ne 0 ]; then echo "make bench: some targets were missed (see FAIL above and docs/performance.md)"; fi; \
	exit $$status

# The tables, JSON and pictures under docs/ that answer the source article's claims.
results: $(STAMP)
	$(PY) -m results

lint: $(STAMP)
	$(PY) -m ruff check asynccomm tests examples benchmarks results
	$(PY) -m mypy

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
