# ferry — see README.md. Every target installs what it needs (Kafka jars from
# Maven Central, Go modules) so it works on a fresh machine with Go, Java, Maven.
.PHONY: build release demo test test-short faults hostile soak bench bench-quick fleet fuzz vet clean kafka-start kafka-stop prometheus-compat screenshot

GO ?= go
BIN := bin

build:
	$(GO) build -o $(BIN)/ferry ./cmd/ferry
	$(GO) build -o $(BIN)/ferry-bench ./cmd/ferry-bench

# Static, version-stamped binaries for linux/amd64 and linux/arm64 with
# SHA-256 sums under dist/ (VERSION, PLATFORMS, OUT to change them).
release:
	scripts/release.sh

# Real local Kafka + agent + ~20 s of load through ferry, verified by consuming.
demo: build
	scripts/demo.sh

# Unit, fuzz-smoke and integration tests against a real local Kafka, with -race.
test:
	scripts/test.sh

# What packaging/ ships, checked with the tools it is for: the systemd unit
# (systemd-analyze), the alerting rules and the dashboard's queries
# (promtool: check rules, test rules), the metric names they use against
# real agents and Kafka, and the Helm chart (helm lint, helm template,
# ferry validate). promtool and helm are built once by scripts/prometheus-local
# and scripts/helm-local (make test does the same).
.PHONY: packaging
packaging:
	scripts/kafka-local jars
	scripts/prometheus-local promtool >/dev/null
	scripts/helm-local build >/dev/null
	$(GO) test -count=1 ./packaging

# Every seed's table measured on this machine beside Kafka's own tools, and
# OTLP, log files and the other doors (Zipkin, remote write, span metrics)
# into Kafka beside the OpenTelemetry Collector (built once by
# scripts/otelcol-local) and rsyslog (scripts/rsyslog-local install,
# apt-get when missing), in one run (about 62 min on 2 cores), then section
# 12's cost curves (--only curves, about 10 min): rewrites BENCHMARKS.md and
# docs/bench/*.svg. First, the runtime.adaptive_procs
# tests under a real load, which need a core to themselves (FERRY_REAL_LOAD).
bench: build prometheus-compat
	FERRY_REAL_LOAD=1 $(GO) test -count=1 -run 'TestControllerFollowsRealLoad|TestAdaptiveProcs' ./cmd/ferry/...
	scripts/kafka-local jars
	bin/ferry-bench suite
	bin/ferry-bench suite --only curves

# Every step of make bench with tiny inputs (about 7 min, plus a few minutes to build the
# Collector on a fresh machine), to keep the harness
# working (CI runs it); writes to $(BENCH_QUICK_DIR), figures not meaningful.
# Section 12's curves are left out (2 more minutes of CI): their rendering is
# unit-tested (TestWriteCurves); `bin/ferry-bench suite --quick --only curves`
# runs their harness.
BENCH_QUICK_DIR ?= /tmp/ferry-bench-quick
bench-quick: build
	scripts/kafka-local jars
	bin/ferry-bench suite --quick --out $(BENCH_QUICK_DIR)/BENCHMARKS.md --charts $(BENCH_QUICK_DIR)/bench --port 29492
	bin/ferry-bench fleet --agents 1,2 --lingers 5ms --rate 2000 --duration 3s --warmup 2s --cluster-warmup 0s --port 29592 >$(BENCH_QUICK_DIR)/fleet.md
	cat $(BENCH_QUICK_DIR)/fleet.md

# N ferry agents against a local 3-broker cluster, the same total load at
# each size (~7 min, 90 s of it warming the brokers up); rewrites the measured table in docs/scaling.md.
fleet: build
	scripts/kafka-local jars
	bin/ferry-bench fleet --out docs/scaling.md

# A real Prometheus server (agent mode, built once from its Go module by
# scripts/prometheus-local: 14 CPU-minutes the first time) scraping and
# remote-writing 1.0 and 2.0 to the real agent, read back from a real Kafka.
# make test runs it too, after building promtool from the same module.
PROM_KAFKA_PORT ?= 29692
prometheus-compat:
	scripts/kafka-local jars
	scripts/prometheus-local build >/dev/null
	scripts/kafka-local start --port $(PROM_KAFKA_PORT)
	FERRY_PROMETHEUS_SERVER=1 FERRY_TEST_KAFKA=127.0.0.1:$(PROM_KAFKA_PORT) $(GO) test -count=1 -run TestPrometheusServerRemoteWrite ./proofs/compat; \
	  st=$$?; scripts/kafka-local stop --port $(PROM_KAFKA_PORT); exit $$st

# The README's status page picture (docs/status-page.png) and ferry top
# frame (docs/top.txt) from a real run: a minute of varying load through
# the real agent into a local Kafka, shot by headless Chromium (~2 min).
SHOT_KAFKA_PORT ?= 29792
screenshot:
	scripts/kafka-local jars
	scripts/chromium-local >/dev/null
	scripts/kafka-local start --port $(SHOT_KAFKA_PORT)
	FERRY_SCREENSHOT=$(CURDIR)/docs/status-page.png FERRY_TOP_CAPTURE=$(CURDIR)/docs/top.txt FERRY_TEST_KAFKA=127.0.0.1:$(SHOT_KAFKA_PORT) \
	  $(GO) test -count=1 -run TestStatusPageScreenshot ./proofs/operate; \
	  st=$$?; scripts/kafka-local stop --port $(SHOT_KAFKA_PORT); exit $$st

# The fault tests at full length (~15 min, real Kafka killed and restarted, a
# 3-broker cluster's leader killed and paused); rewrites the results tables
# in docs/reliability.md. make test runs short ones.
faults:
	scripts/faults.sh

# The randomized fault soak (proofs/soak): HTTP, the Go client, the Java
# SDK and Kafka's Java producer into a 3-broker cluster (ports
# SOAK_PORT..+5) while faults drawn from a seed hit the agent, the brokers,
# the connections, the spool's disk and the keys; every id checked, and a
# leak check. DURATION of load per mode (every mode: 4 x DURATION plus
# about a minute each); MODES=spool,kafka to choose; SEED=N reproduces a
# run. Rewrites the soak table in docs/reliability.md. make test runs 15 s
# each of the spool modes (spool, exactly_once).
DURATION ?= 30m
MODES ?= all
SOAK_PORT ?= 29400
soak:
	DURATION=$(DURATION) MODES=$(MODES) PORT=$(SOAK_PORT) SEED=$(SEED) scripts/soak.sh

# Every hostile-client attack against the real binary over the network
# (about 2 min); rewrites the results table in docs/reliability.md. make
# test runs the same tests.
hostile:
	scripts/hostile.sh

# Unit tests only (no Kafka, no Java): quick feedback while editing.
test-short:
	$(GO) test -short -race ./...

# Longer fuzzing of every decoder and converter (FUZZTIME each).
FUZZTIME ?= 2m
fuzz:
	FUZZTIME=$(FUZZTIME) scripts/fuzz.sh

vet:
	gofmt -l . | (! grep .) || (echo "gofmt needed on the files above" && exit 1)
	$(GO) vet ./...

kafka-start:
	scripts/kafka-local start
kafka-stop:
	scripts/kafka-local stop

clean:
	rm -rf $(BIN)
