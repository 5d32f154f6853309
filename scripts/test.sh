#!/usr/bin/env bash
# make test: format and vet checks, unit tests, a short fuzz run, and the
# integration tests against one real local Kafka shared by the whole run.
set -euo pipefail
cd "$(dirname "$0")/.."
port=${FERRY_TEST_KAFKA_PORT:-29092}

# The agent's module, and the OpenTelemetry SDK test module (kept apart so
# the SDK stays out of the agent's go.mod).
modules=(. proofs/otelsdk)

echo "== go modules"
for m in "${modules[@]}"; do (cd "$m" && go mod download); done
echo "== Kafka jars"
scripts/kafka-local jars
echo "== confluent-kafka for Python (librdkafka, for the Kafka front's compat test)"
scripts/confluent-kafka-python >/dev/null
echo "== OpenTelemetry telemetrygen (for the OTLP integration test)"
tgver=$(sed -n 's/^const TelemetrygenVersion = "\(.*\)"/\1/p' proofs/harness/kafkatest/kafkatest.go)
tgdir="${FERRY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ferry}/telemetrygen-$tgver"
[ -x "$tgdir/telemetrygen" ] || GOBIN="$tgdir" go install "github.com/open-telemetry/opentelemetry-collector-contrib/cmd/telemetrygen@$tgver"

echo "== rsyslog (for the syslog receiver's tests: a real rsyslogd forwarding over TCP and TLS)"
scripts/rsyslog-local >/dev/null
echo "== promtool and helm (packaging/: the alerting rules and the dashboard's queries, the Helm chart)"
# Built once from their Go modules and cached. With empty Go caches on 2
# shared cores: promtool 5.3 min (8 CPU-min), then helm 1.2 min more (it
# reuses most of promtool's compiled packages; 4.2 min alone); later runs 0.
scripts/prometheus-local promtool >/dev/null
scripts/helm-local build >/dev/null
echo "== a real Prometheus server (proofs/compat: it scrapes and remote-writes 1.0 and 2.0 to the real agent)"
# The same module as promtool, whose compiled packages it reuses: about
# 1.3 min more on a fresh machine, nothing once cached.
scripts/prometheus-local build >/dev/null

echo "== iproute2 (proofs/soak's network fault: tc netem, where the kernel has it)"
scripts/soak.sh deps

echo "== chromium and tmux (for the status page and ferry top: a real browser and a real terminal)"
scripts/chromium-local >/dev/null

echo "== gofmt, go vet"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then echo "gofmt needed: $unformatted"; exit 1; fi
for m in "${modules[@]}"; do (cd "$m" && go vet ./...); done

echo "== local Kafka on 127.0.0.1:$port"
scripts/kafka-local stop --port "$port" >/dev/null 2>&1 || true
trap 'scripts/kafka-local stop --port "$port"' EXIT
scripts/kafka-local start --port "$port"

echo "== short fuzz runs of the decoders and converters (make fuzz runs them longer)"
# A count, not a duration: go1.26's fuzz coordinator can fail a run that
# found nothing with "context deadline exceeded" when a duration ends
# mid-execution (go.dev/issue/75804); a count has no deadline to race.
# 20000 inputs a target (37 targets, about 3 min on 2 cores) keeps CI
# under its 25-minute budget; make fuzz runs 2 minutes a target.
FUZZTIME=${FUZZTIME:-20000x} scripts/fuzz.sh

echo "== go test -race (unit + integration)"
status=0
: >/tmp/ferry-test.$$.log
for m in "${modules[@]}"; do
  # A failing module must not stop the others (set -e would end the script here).
  if ! (cd "$m" && FERRY_TEST_KAFKA=127.0.0.1:$port FERRY_PROMETHEUS_SERVER=1 go test -race -count=1 -timeout 15m ./...) 2>&1 | tee -a /tmp/ferry-test.$$.log; then
    status=1
  fi
done
echo "== Java SDK (sdk/java: protocol vectors, then against the real agent and Kafka)"
go build -o bin/ferry ./cmd/ferry
go build -o bin/ferry-bench ./cmd/ferry-bench
if (cd sdk/java && FERRY_BIN="$PWD/../../bin/ferry" FERRY_BENCH_BIN="$PWD/../../bin/ferry-bench" FERRY_TEST_KAFKA=127.0.0.1:$port \
    mvn -q -B -Dstyle.color=never verify) 2>&1 | tee -a /tmp/ferry-test.$$.log; then
  printf "\nok  \tsdk/java\n" | tee -a /tmp/ferry-test.$$.log
else
  printf "\nFAIL\tsdk/java\n" | tee -a /tmp/ferry-test.$$.log
  status=1
fi
passed=$(grep -c '^ok ' /tmp/ferry-test.$$.log || true)
# A failed package's line is "FAIL<tab>package"; go test also prints a bare
# "FAIL" after the failing test's output and at the module's end.
failed=$(grep -c "$(printf '^FAIL\t')" /tmp/ferry-test.$$.log || true)
rm -f /tmp/ferry-test.$$.log
echo "packages: $passed passed, $failed failed"
exit "$status"
