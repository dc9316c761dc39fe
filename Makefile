# Two entry points: `make demo` and `make test`. Both create the virtualenv and install first.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml harness/pyproject.toml requirements.lock 2>/dev/null | sha1sum | cut -c1-12)

.PHONY: demo test install class-archive lint bench lock clean java dagster ui-screenshot metrics-screenshot jars stack stack-down stack-status demo-stack stack-cuts \
	torture-stack bench-latency docs docs-serve

java:
	@command -v java >/dev/null 2>&1 || [ -x "$$JAVA_HOME/bin/java" ] || { \
	  echo "Java 17 is required for Spark: install a JDK/JRE 17 (e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME." >&2; exit 1; }

# uv's cache is left out (--no-cache): pyspark comes as a source archive, and the cache kept its
# unpacked source and built wheel, 1.9 GB on disk beside the 1.7 GB venv (3.5 GB of cache, the rest
# hard links into the venv), which a CI machine's disk may not have.
# The dependencies are compiled to bytecode once, as pip compiles them for its users: uv does not by
# default, and where PYTHONDONTWRITEBYTECODE is set every process then compiles what it imports again
# (timed by hand, not a repo script: Great Expectations' import took 9.2 s instead of 4.4 s, and the
# suite's collection 19.4 s instead of 10.0 s; compiling takes about 20 s once).
$(STAMP):
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "Python 3.11 is required ($(PYTHON) not found)." >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --no-cache-dir --upgrade pip uv
	$(BIN)/uv pip install --python $(BIN)/python --quiet --no-cache --compile-bytecode -r requirements.lock
	$(BIN)/uv pip install --python $(BIN)/python --quiet --no-cache --no-deps -e . -e harness
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

# The driver JVM's class-data-sharing archive of Spark's classes (ingest/spark/class_archive.py): written
# once per Java and pyspark into the venv (about a minute), it saves seconds on every Spark start.
class-archive: java install
	$(BIN)/python -m ingest.spark.class_archive

# `make demo LAKE=s3`: the same demo with its tables on the stack's MinIO (configs/demo-s3.yaml),
# which is started first and built from its Go module the first time (about six minutes).
LAKE ?= local
demo: java install class-archive
ifeq ($(LAKE),s3)
	$(BIN)/python -m harness.stack up --components s3
	eval "$$($(BIN)/python -m harness.stack env)" && $(BIN)/ingest demo -c configs/demo-s3.yaml
else
	$(BIN)/ingest demo
endif

# Each test's seconds go to .test-results/suite.xml (scripts/suite_times.py reads it). Three workers
# suit two cores (docs/proofs.md); a larger machine may give more: `make test TEST_WORKERS=6`. Each
# worker holds a Spark session of its own: with three, and the stack's servers, a run here used at most
# 12.6 GB (sampled by hand).
# What the suite would otherwise wait for at its start -- the stack's Debian packages and jars (its
# tests' worker), Spark's connectors (the others' first Spark session) -- is fetched while the class
# archive is written; a failure is shown and left to the tests that need it to report.
TEST_WORKERS ?= 3
TEST_STACK = $$($(BIN)/python -c 'from harness.stack import CDC_COMPONENTS; print(",".join(CDC_COMPONENTS))')
test: java install
	@mkdir -p .test-results
	@echo "preparing the stack and Spark's connectors beside the class archive (logs: .test-results/prepare-*.log)"
	@$(BIN)/python -m harness.stack prepare --components $(TEST_STACK) > .test-results/prepare-stack.log 2>&1 & \
	  stack=$$!; $(BIN)/ingest jars > .test-results/prepare-jars.log 2>&1 & jars=$$!; \
	  $(BIN)/python -m ingest.spark.class_archive; archive=$$?; \
	  wait $$stack || { echo "preparing the stack failed:"; tail -5 .test-results/prepare-stack.log; }; \
	  wait $$jars || { echo "resolving Spark's connectors failed:"; tail -5 .test-results/prepare-jars.log; }; \
	  exit $$archive
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --durations=15 --junitxml=.test-results/suite.xml

lint: install
	$(BIN)/ruff check ingest harness assets dagster_project tests scripts benchmarks
	$(BIN)/mypy ingest
	$(BIN)/lint-imports

bench: java install class-archive
	$(BIN)/python benchmarks/bench_ingest.py

# The Dagster UI (http://127.0.0.1:3000) over configs/demo.yaml; runs, materializations, checks and
# sensor cursors are kept in .dagster_home/ (git-ignored) across restarts.
dagster: java install class-archive
	mkdir -p .dagster_home && cp dagster_project/dagster.yaml .dagster_home/dagster.yaml
	DAGSTER_HOME=$(CURDIR)/.dagster_home VIRTUAL_ENV=$(CURDIR)/$(VENV) $(BIN)/dg dev --port 3000

# Materialize every asset through the webserver's GraphQL API and screenshot the asset graph
# (docs/img/dagster-asset-graph.png). Needs Chromium (apt-get install chromium); not part of `make test`.
ui-screenshot: java install
	$(BIN)/python scripts/ui_screenshot.py

# A real run's metrics in Prometheus' graph page (docs/img/metrics-prometheus.png), with the queries of
# infra/monitoring/grafana-dashboard.json. Needs Prometheus and Chromium (apt-get install prometheus
# chromium); not part of `make test`.
metrics-screenshot: java install
	$(BIN)/python scripts/metrics_screenshot.py

# The real stack on loopback, without Docker (docs/stack.md): PostgreSQL 15, Kafka 4.3 (KRaft),
# Kafka Connect + Debezium 3.6, Apicurio Registry 3.3 (+ nginx basic auth). Data, logs and jars go
# to .stack/ (git-ignored; STACK_DIR overrides). `jars` resolves the JVM jars with Maven (infra/jvm).
jars: install
	$(BIN)/python -m harness.stack jars

stack: install
	$(BIN)/python -m harness.stack up

stack-down: install
	$(BIN)/python -m harness.stack down

stack-status: install
	$(BIN)/python -m harness.stack status

# The real path end to end: start the stack, reset the `shop` schema (and its topics and the
# workdirs under stack-work/), run the seeded SQL workload, wait for Debezium, ingest it with
# configs/stack.yaml (Avro) and configs/stack-json.yaml (JSON), and verify both against SELECTs of
# PostgreSQL (`ingest verify --source-db`). Exit 1 on any difference. Credentials come from the
# stack's settings (.stack/credentials.env), not from the shell.
demo-stack: java install
	$(BIN)/ingest demo-stack

# Faults on the real stack while PostgreSQL keeps changing (about 30 min here; resets the `shop` schema and its
# topics): `ingest run --continuous` SIGKILLed (from outside and at named points) and restarted, broker, Connect,
# registry and PostgreSQL restarted, 30 faults in a seeded order; then every table against PostgreSQL, duplicate
# keys, audit balance, records received once. Exit 1 on any divergence.
torture-stack: java install
	$(BIN)/ingest torture --stack --seed 1 --faults 30

# Consistent reads across tables on the real stack (a few minutes): a `bank` schema whose transactions span
# tables, its own Debezium connector with transaction metadata, `ingest run --continuous` killed and restarted,
# the broker and Connect restarted, a reader checking the cross-table invariants at the latest cut and at the
# latest versions; then every table against PostgreSQL and the cut lag. Exit 1 if a consistent read broke.
stack-cuts: java install
	$(BIN)/python -m harness.stack_proofs.cuts --seconds 180 --rate 20

# Continuous-mode latency (PostgreSQL commit -> visible in Delta) on the stack: 500 and 2,000 changes/s asked,
# one table and the four shop tables, three runs each, at the default trigger; then 500/s at a 0.5 s trigger
# (about 45 minutes in all); where the time goes.
bench-latency: java install
	$(BIN)/python benchmarks/bench_latency.py
	$(BIN)/python benchmarks/bench_latency.py --rates 500 --trigger 0.25

# The documentation site (mkdocs.yml): regenerate the generated pages (the configuration reference from
# ingest/config/, the benchmarks page from benchmarks/results/), then build into site/ (git-ignored) in
# strict mode, so a broken link or anchor fails. `docs-serve` serves it on http://127.0.0.1:8000.
docs: install
	$(BIN)/python scripts/gen_config_reference.py
	$(BIN)/python benchmarks/render_results.py
	$(BIN)/mkdocs build --strict --site-dir site

docs-serve: install
	$(BIN)/mkdocs serve --strict --dev-addr 127.0.0.1:8000

# Re-resolve the pinned set after changing pyproject.toml.
lock:
	$(BIN)/uv pip compile pyproject.toml --extra dev --python-version 3.11 -o requirements.lock

clean:
	rm -rf $(VENV) demo-work demo-work-s3 site
