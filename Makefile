# One entry point for the demo, the tests and the benchmarks. Every target installs what it
# needs first (venv, Python packages, redis-server, Kafka and Spark jars, the Schema Registry), so
# a fresh machine needs only these commands.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: setup test test-fast demo bench lint stack-up stack-down clean

# The Spark job is its own distribution (eoguard-spark, import name eoguard_spark) in connectors/spark.
$(STAMP): pyproject.toml connectors/spark/pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[dev,metrics,registry]' -e ./connectors/spark
	touch $(STAMP)

setup: $(STAMP)
	$(BIN)/python -m eoguard.stack install

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The developer loop: unit, integration and CLI tests on the single-node stack, four at a time
# (pytest-xdist), no fault, Spark or packaging tests. The stack is started first (a no-op when
# it runs) so the parallel workers all find it up; it is left running for the next round.
FAST_MARKS := not fault and not spark and not packaging
test-fast: setup
	$(BIN)/python -m eoguard.stack up > /dev/null
	$(BIN)/python -m pytest -n 4 --topology single -m "$(FAST_MARKS)" tests/unit tests/integration tests/cli $(PYTEST_ARGS)

demo: setup
	$(BIN)/eoguard-dev demo

bench: setup
	$(BIN)/python -m bench

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy

stack-up: setup
	$(BIN)/python -m eoguard.stack up

stack-down: setup
	$(BIN)/python -m eoguard.stack down

clean:
	-$(BIN)/python -m eoguard.stack down --clean
	rm -rf $(VENV) .cache
