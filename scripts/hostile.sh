#!/usr/bin/env bash
# make hostile: every attack of the hostile-input review thrown at the real
# binary over the network, with a real broker and a well-behaved client
# running alongside (proofs/hostile/). Rewrites the table in docs/reliability.md
# from what it measured. make test runs the same tests (without the report).
set -euo pipefail
cd "$(dirname "$0")/.."
port=${FERRY_TEST_KAFKA_PORT:-29292}
go mod download
scripts/kafka-local jars
scripts/kafka-local stop --port "$port" >/dev/null 2>&1 || true
trap 'scripts/kafka-local stop --port "$port"' EXIT
scripts/kafka-local start --port "$port"
echo "== hostile-client tests (each attack's answer and peak RSS below as it finishes)"
log=$(mktemp /tmp/ferry-hostile.XXXXXX.log)
status=0
FERRY_HOSTILE_REPORT="$PWD/docs/reliability.md" FERRY_TEST_KAFKA=127.0.0.1:$port \
  go test -count=1 -v -timeout 20m ./proofs/hostile 2>&1 | tee "$log" | grep --line-buffered -E '^(=== RUN|--- |ok|FAIL|PASS)|result:' || status=$?
if grep -q '^--- FAIL' "$log"; then
  echo "== failures (full output: $log)"
  grep -E '^\s+(hostile|harness)_test.go:[0-9]+:' "$log" | head -40
  exit 1
fi
echo "docs/reliability.md updated (full output: $log)"
exit "$status"
