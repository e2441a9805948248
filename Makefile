# Each target sets up .venv itself: `make demo` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Links under the installed names of the folders (estafeta_sql -> sql, ...): mypy and the docs'
# API reference read the packages through them (neither follows an editable install's finder).
NAMES  := .import-names/.made

.PHONY: demo test test-heavy chaos chaos-short unit integration lint typecheck bench clean docs docs-serve system-deps

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[dev,embedded,http,eventsourcing,docs]'
	touch $(STAMP)

$(NAMES):
	mkdir -p .import-names
	for folder in actors brokers cli console sql; do ln -sfn ../$$folder .import-names/estafeta_$$folder; done
	touch $@

## The main job: the order system end to end on an embedded PostgreSQL and the StubBroker.
demo: $(STAMP)
	$(BIN)/estafeta demo

## The suite: lint, types, layering, unit and integration tests (and the docs' code blocks),
## all but the long runs marked heavy, in a process per core (pytest-xdist; each process has
## a database, vhost and Redis namespace of its own). As root it first installs the system
## packages the suite needs (make system-deps).
test: $(STAMP) lint typecheck
	@if [ "$$(id -u)" = 0 ]; then scripts/system-deps.sh; fi
	$(BIN)/pytest -m "not heavy" -n auto --durations=15

## The long runs (volume under kills, clusters, failover, a pip install) but the network
## fault suite's; .ci/run runs them after make test, then make chaos-short: CI runs every
## test. The benchmark's peers are tested here, so it installs the bench extra.
test-heavy: $(STAMP)
	@if [ "$$(id -u)" = 0 ]; then scripts/system-deps.sh; fi
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/pytest -m heavy --ignore=tests/faults --durations=30

## The network fault suite's long runs as CI runs them: every fault once for 5 s, RabbitMQ
## as the broker (CHAOS_SEED=N replays a run's order of faults).
chaos-short: $(STAMP)
	@if [ "$$(id -u)" = 0 ]; then scripts/system-deps.sh; fi
	$(BIN)/pytest tests/faults -m heavy

## The network fault suite (tests/faults: partitions, one-way cuts and packet loss between
## components in network namespaces; needs root and nftables), printing what each fault did.
## Faults last 60 s here (past every client's timeout; packet loss 20 s; CI's run: 5 s), and
## the broker faults run with RabbitMQ, Redis and Kafka; CHAOS_SEED=N replays a run's order
## of faults, CHAOS_FAULT_SECONDS=N changes their length, CHAOS_BROKERS=redis picks brokers.
chaos: $(STAMP)
	@if [ "$$(id -u)" = 0 ]; then scripts/system-deps.sh; fi
	CHAOS_FAULT_SECONDS=$${CHAOS_FAULT_SECONDS:-60} CHAOS_BROKERS=$${CHAOS_BROKERS:-rabbitmq,redis,kafka} \
	  $(BIN)/pytest tests/faults -s

## The Debian packages the suite needs that pip cannot install: Chromium, chromedriver, Prometheus, nftables.
system-deps:
	scripts/system-deps.sh

## The documentation site in site/ (MkDocs, warnings are errors); docs-serve serves it on :8000.
## NO_MKDOCS_2_WARNING: Material prints a banner about its maintenance (until 2027) on every build.
docs: $(STAMP) $(NAMES)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --clean

docs-serve: $(STAMP) $(NAMES)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict

unit: $(STAMP)
	$(BIN)/pytest -m "not integration"

integration: $(STAMP)
	$(BIN)/pytest -m integration

## Lint, format, layering (import-linter) and no import cycle (module- or function-level, or type-only).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/python scripts/check_import_cycles.py --type-checking

typecheck: $(STAMP) $(NAMES)
	$(BIN)/mypy

## Benchmarks: each prints its figures beside the baselines measured in the same run.
bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python -m bench.relay
	$(BIN)/python -m bench.sagas
	$(BIN)/python -m bench.locks
	$(BIN)/python -m bench.events
	$(BIN)/python -m bench.wakeups
	$(BIN)/python -m bench.es_adapter
	$(BIN)/python -m bench.observe
	$(BIN)/python -m bench.http
	$(BIN)/python -m bench.console
	$(BIN)/python -m bench.ha

clean:
	rm -rf $(VENV) .estafeta .import-names build site *.egg-info
