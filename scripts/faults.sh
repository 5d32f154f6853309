#!/usr/bin/env bash
# make faults: the fault tests at full length (about 15 minutes): broker
# SIGKILL under 60 s of load in every delivery mode, agent SIGKILL in spool
# mode, Kafka down for 3 minutes of overload, a damaged spool, a full disk,
# the files receiver (rotation both ways, SIGKILL mid-rotation, Kafka down,
# checkpoint disk full), and a 3-broker cluster whose partition leader is
# killed, then paused.
# Each test prints a "result:" line; the table in docs/reliability.md is
# rewritten from them. Short versions of the same tests run in make test.
set -euo pipefail
cd "$(dirname "$0")/.."
port=${FERRY_TEST_KAFKA_PORT:-29192}
go mod download
scripts/kafka-local jars
scripts/kafka-local stop --port "$port" >/dev/null 2>&1 || true
trap 'scripts/kafka-local stop --port "$port"' EXIT
scripts/kafka-local start --port "$port"
echo "== fault tests (full length; progress below as each finishes)"
log=$(mktemp /tmp/ferry-faults.XXXXXX.log)
status=0
FERRY_FAULTS=full FERRY_FAULTS_REPORT="$PWD/docs/reliability.md" FERRY_TEST_KAFKA=127.0.0.1:$port \
  go test -count=1 -v -timeout 60m ./proofs/faults 2>&1 | tee "$log" | grep --line-buffered -E '^(=== RUN|--- |ok|FAIL|PASS)|result:' || status=$?
if grep -q '^--- FAIL' "$log"; then
  echo "== failures (full output: $log)"
  grep -A40 -E '^\s+faults_test.go:[0-9]+: (agent|.*not in Kafka|.*lost|.*want)' "$log" | head -80
  exit 1
fi
echo "docs/reliability.md updated (full output: $log)"
exit "$status"
