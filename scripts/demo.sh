#!/usr/bin/env bash
# make demo: a real local Kafka, the ferry agent on its defaults, ~20 s of
# 100-byte records through ferry, then the same load straight to Kafka for
# comparison; the topic is consumed back to verify the count, and a table is
# printed. Everything is stopped and Kafka's data deleted at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DEMO_DURATION:-20s}
work=$(mktemp -d /tmp/ferry-demo.XXXXXX)
ferry_pid=""
cleanup() {
  [ -n "$ferry_pid" ] && kill -TERM "$ferry_pid" 2>/dev/null && wait "$ferry_pid" 2>/dev/null || true
  scripts/kafka-local stop >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

step() { printf '\n== %s\n' "$*"; }

step "starting a local Apache Kafka (KRaft) on 127.0.0.1:9092"
scripts/kafka-local start

topic="ferry-demo-$(date +%s)"
direct_topic="$topic-direct"
bin/ferry-bench topic create --topic "$topic" --partitions 3
bin/ferry-bench topic create --topic "$direct_topic" --partitions 3

step "starting ferry on its defaults (HTTP 127.0.0.1:8088, admin 127.0.0.1:8089)"
bin/ferry run >"$work/ferry.log" 2>&1 &
ferry_pid=$!
for _ in $(seq 1 100); do
  curl -fs http://127.0.0.1:8089/readyz >/dev/null 2>&1 && break
  sleep 0.1
done
curl -fs http://127.0.0.1:8089/readyz >/dev/null || { echo "ferry did not become ready:"; cat "$work/ferry.log"; exit 1; }

cpu_ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
tck=$(getconf CLK_TCK)

step "$DURATION of 100-byte records through ferry (32 concurrent requests of 1000 NDJSON records)"
c0=$(cpu_ticks "$ferry_pid"); t0=$(date +%s.%N)
bin/ferry-bench produce --target http://127.0.0.1:8088 --topic "$topic" --record-size 100 \
  --num-records 1000000000 --duration "$DURATION" --batch 1000 --concurrency 32 --report-json "$work/via.json"
c1=$(cpu_ticks "$ferry_pid"); t1=$(date +%s.%N)
rss_kb=$(awk '/VmHWM/{print $2}' "/proc/$ferry_pid/status")
cpu_pct=$(awk -v c="$((c1 - c0))" -v t="$tck" -v a="$t0" -v b="$t1" 'BEGIN{printf "%.0f", 100*c/t/(b-a)}')

step "consuming $topic to verify every acknowledged record is in Kafka"
bin/ferry-bench consume --topic "$topic" --timeout 5s --report-json "$work/consumed.json"

step "the same load straight to Kafka with franz-go (same producer settings), for comparison"
bin/ferry-bench produce --target kafka://127.0.0.1:9092 --topic "$direct_topic" --record-size 100 \
  --num-records 1000000000 --duration "${DEMO_DIRECT_DURATION:-10s}" --report-json "$work/direct.json"

step "ferry's own account (GET /metrics)"
curl -fs http://127.0.0.1:8089/metrics | grep -E '^ferry_(receiver_received_records_total|exporter_sent_records_total|exporter_dropped_records_total|queue_bytes)' || true

echo
bin/ferry-bench table --via "$work/via.json" --direct "$work/direct.json" --consumed "$work/consumed.json" \
  --agent-cpu "$cpu_pct" --agent-rss-kb "$rss_kb"
