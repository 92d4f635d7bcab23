# Two entry points on a fresh clone: `make demo` and `make test`.
# Everything they need (virtual environment, CRIU, PostgreSQL for the store
# tests) is provisioned here, so CI and a new user run the same steps.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CUTBENCH := $(BIN)/cutbench
DEMO_SCENARIO ?= $(shell $(BIN)/python -m cutbench.harness.environment.gpu_probe --pick-scenario 2>/dev/null || echo scenarios/quick.toml)

.PHONY: venv criu postgres chromium containers gromacs slurm demo lint test clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip "setuptools>=77"
	$(BIN)/python -m pip install -q -e '.[test,pg,containers,ray]'
	touch $@

venv: $(VENV)/.installed

# Uses a CRIU >= 4.2 on PATH, else fetches Debian's package into .criu/.
criu: venv
	$(CUTBENCH) criu install

# The PostgreSQL store tests start a throwaway cluster; they need the server
# binaries, which this installs from Debian when absent.
postgres:
	@sh .ci/provision-postgres.sh

# The report test opens report.html in a real headless browser: Debian's chromium.
chromium:
	@sh .ci/provision-chromium.sh

# The program tests run GROMACS as it is (examples/programs/gromacs): Debian's gromacs.
gromacs:
	@sh .ci/provision-gromacs.sh

# The slurm backend's tests preempt jobs on a real Slurm: Debian's slurmctld, slurmd and MUNGE, installed here
# when absent (the tests start and stop the project's own one-node cluster).
slurm:
	@sh .ci/provision-slurm.sh

# The docker and podman backend tests run real engines: Debian's docker.io and
# podman, installed here when absent (the tests start and stop their dockerd).
containers:
	@sh .ci/provision-containers.sh

# Exit 1 means "invalid recoveries found": the expected result of the demo.
demo: criu
	$(CUTBENCH) run $(DEMO_SCENARIO) || [ $$? -eq 1 ]
	@echo "demo done: the invalid recoveries above are what it is meant to show (a restore that repeats effects an"
	@echo "at_least_once receiver already applied). Open results/latest/report.html; cutbench replay reruns any trial."

# ruff and mypy, configured in pyproject.toml; first in `make test`, so a lint error fails before the suite runs.
# mypy reads the package as the wheel lays it out (it knows neither package-dir nor cutbench.__path__):
# build/mypy/cutbench/ links the ground floor's files and the three folders, made afresh each time
# (pyproject.toml's mypy_path points there).
MYPY_TREE := build/mypy/cutbench

lint: venv
	$(BIN)/python -m ruff check .
	rm -rf $(MYPY_TREE) && mkdir -p $(MYPY_TREE)
	ln -s $(CURDIR)/cutbench/*.py $(CURDIR)/harness $(CURDIR)/workloads $(CURDIR)/receivers $(MYPY_TREE)/
	$(BIN)/python -m mypy

# pytest-xdist, one worker per core: CRIU's dumps and restores are kernel work, and four workers on two cores
# spent it contending (the whole suite side by side on one 2-core machine: 1368 s with 4 workers and 3 tests
# failed on their neighbours' load, 1124 s with 2 and none). --dist loadgroup keeps a group (the container
# engines, Ray, a module's shared fixture) on one worker.
TEST_WORKERS ?= 2

test: lint criu postgres chromium containers gromacs slurm
	CUTBENCH_REQUIRE_POSTGRES=1 CUTBENCH_REQUIRE_BROWSER=1 CUTBENCH_REQUIRE_CONTAINERS=1 CUTBENCH_REQUIRE_GROMACS=1 \
		CUTBENCH_REQUIRE_SLURM=1 \
		$(BIN)/pytest -q -ra --durations=15 -n $(TEST_WORKERS) --dist loadgroup

clean:
	rm -rf $(VENV) .criu build *.egg-info
