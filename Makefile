# hybridtrain — two commands do all set-up:  `make demo`  and  `make test`.
# Each creates/updates .venv from the pinned set (requirements/lock.txt) by itself.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.hybridtrain-installed
export DVC_NO_ANALYTICS := 1
export MLFLOW_DISABLE_TELEMETRY := true
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PIP_DISABLE_PIP_VERSION_CHECK := 1
PREFECT_PORT ?= 4200
MLFLOW_PORT  ?= 5000
UI_API := http://127.0.0.1:$(PREFECT_PORT)/api

.PHONY: venv system demo test test-fast ui ui-stop deploy worker bench lock clean up down status doctor

venv: $(STAMP)

# torch first, pinned: the registry's newest torch would pull several GB of CUDA packages.
# Then the whole pinned set (every transitive version fixed, so pip never backtracks).
$(STAMP): requirements/lock.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -r requirements/lock.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $(STAMP)

demo: venv
	$(BIN)/hybridtrain demo

# Debian packages the tests and `make up` need beyond pip (sshd, PostgreSQL 15, chromium); quick
# when installed; without root it prints the one command to run and stops.
system:
	scripts/setup-system.sh

# Test files run in parallel, one worker per CPU core (at most 4; each starts its own Prefect
# server). `make test TEST_WORKERS=0` runs them serially. --no-loadscope-reorder: files are handed
# out in collection order, which tests/conftest.py starts with the longest files (xdist's own order,
# most tests first, left the 7-minute federated file, one test, to start last).
TEST_WORKERS ?= auto
test: venv system
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --maxprocesses 4 --no-loadscope-reorder

# The quick tier (under 5 minutes on 2 cores): everything not marked slow, i.e. no whole lifecycle and
# no extra servers beyond the one Prefect test server; the import contracts first.
test-fast: venv system
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --maxprocesses 4 --no-loadscope-reorder -m "not slow" --timeout 300

# Prefect UI + API and MLflow UI on loopback, over the same stores `make demo` wrote.
ui: venv
	@mkdir -p .hybridtrain/logs
	PREFECT_HOME=$(CURDIR)/.hybridtrain/prefect nohup $(BIN)/prefect server start --host 127.0.0.1 --port $(PREFECT_PORT) \
		> .hybridtrain/logs/prefect-server.log 2>&1 & echo $$! > .hybridtrain/logs/prefect-server.pid
	nohup $(BIN)/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/.hybridtrain/mlflow/mlflow.db \
		--default-artifact-root $(CURDIR)/.hybridtrain/mlflow/artifacts --host 127.0.0.1 --port $(MLFLOW_PORT) \
		> .hybridtrain/logs/mlflow-ui.log 2>&1 & echo $$! > .hybridtrain/logs/mlflow-ui.pid
	@echo "Prefect UI: http://127.0.0.1:$(PREFECT_PORT)   MLflow UI: http://127.0.0.1:$(MLFLOW_PORT)"
	@echo "Logs in .hybridtrain/logs/; stop both with 'make ui-stop'."

ui-stop:
	-@for f in .hybridtrain/logs/*.pid; do [ -f $$f ] && kill $$(cat $$f) 2>/dev/null; rm -f $$f; done; true

# Pools, blocks and deployments on the server started by `make ui` (or PREFECT_API_URL).
deploy: venv
	PREFECT_API_URL=$${PREFECT_API_URL:-$(UI_API)} $(BIN)/hybridtrain deploy

# One process worker per pool (each environment, and `control` for the burst controller and recovery), in the foreground; Ctrl-C stops them. Beside each, a
# warm-pool daemon (workers/warm_pool.py) with the worker's environment: the pools' `command`
# (workers.warm_client) starts flow runs in its pre-warmed spares, or cold when it is not up.
# Workers poll every second: a due run waits 0.5 s on average (one cheap API call per worker and second).
worker: venv
	@mkdir -p .hybridtrain/run && chmod 700 .hybridtrain/run
	PREFECT_API_URL=$${PREFECT_API_URL:-$(UI_API)} PREFECT_WORKER_QUERY_SECONDS=1 WARM_RUN=$(CURDIR)/.hybridtrain/run \
		sh -c 'for pool in onprem cloud control; do \
		         HYBRIDTRAIN_WARM_SOCKET=$$WARM_RUN/warm-$$pool.sock $(BIN)/python -m workers.warm_pool --spares 2 & \
		         HYBRIDTRAIN_WARM_SOCKET=$$WARM_RUN/warm-$$pool.sock $(BIN)/prefect worker start --pool $$pool --type process & \
		       done; wait'

# The served stack on loopback: PostgreSQL, Redis, S3 (moto), `mlflow server`, the Prefect API and services,
# deployments and 2 process workers per pool, then `hybridtrain doctor`. Free ports are picked on the
# first `up` and kept (.hybridtrain/stack/stack.json); choose them with e.g.
# `make up UP_ARGS="--prefect-port 14200 --mlflow-port 15000"`. Data survives `make down && make up`.
up: venv system
	$(BIN)/python scripts/stack.py up $(UP_ARGS)

down:
	$(BIN)/python scripts/stack.py down

status:
	$(BIN)/python scripts/stack.py status

doctor: venv
	$(BIN)/hybridtrain doctor

bench: venv
	$(BIN)/python benchmarks/orchestration_overhead.py

# Regenerate the pinned set after changing dependencies in pyproject.toml.
lock: venv
	$(BIN)/pip freeze --exclude-editable | sed 's/^torch==2.13.0+cpu/torch==2.13.0/' > requirements/lock.txt

clean:
	rm -rf .hybridtrain data/curated data/approved
