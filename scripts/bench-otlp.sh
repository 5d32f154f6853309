#!/usr/bin/env bash
# bk-collector's "benchmark server" table, reproduced: OTLP/HTTP log requests
# of logCount x logLength against ferry with the blackhole exporter (ferry's
# own cost), with Kafka acknowledging every request (wait_for_ack, the
# default), and with Kafka in fire-and-forget mode (what bk-collector does).
# Starts and stops its own local Kafka and agent. REQUESTS=N to scale.
set -euo pipefail
cd "$(dirname "$0")/.."
make -s build
REQUESTS=${REQUESTS:-10000}
shapes="10:1024 10:10240 10:102400 100:1024 100:10240"
ferry_pid=""
cleanup() {
  [ -n "$ferry_pid" ] && kill -TERM "$ferry_pid" 2>/dev/null && wait "$ferry_pid" 2>/dev/null || true
  scripts/kafka-local stop >/dev/null 2>&1 || true
}
trap cleanup EXIT

start_ferry() {
  bin/ferry run "$@" >/tmp/ferry-bench-otlp.log 2>&1 &
  ferry_pid=$!
  for _ in $(seq 1 100); do curl -fs http://127.0.0.1:8089/readyz >/dev/null 2>&1 && return; sleep 0.1; done
  echo "ferry did not become ready"; cat /tmp/ferry-bench-otlp.log; exit 1
}
stop_ferry() { kill -TERM "$ferry_pid"; wait "$ferry_pid" 2>/dev/null || true; ferry_pid=""; }

run_shapes() { # label concurrency
  for s in $shapes; do
    n=${s%%:*}; len=${s##*:}
    reqs=$REQUESTS
    [ "$len" -ge 102400 ] || [ $((n * len)) -ge 1024000 ] && reqs=$((REQUESTS / 5))
    bin/ferry-bench otlp --count "$n" --length "$len" --requests "$reqs" --concurrency "$2" \
      --exporter "$1" --header=false 2>/dev/null || echo "| (run failed: $1 $n x $len) |"
  done
}

echo "| core | signal | count/request | logLength | requests | QPS | elapsed | p50 ms | p99 ms | exporter |"
echo "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
start_ferry --set exporter.type=blackhole
run_shapes blackhole 16
stop_ferry

scripts/kafka-local start >/dev/null
bin/ferry-bench topic create --topic otlp_logs --partitions 3 2>/dev/null
start_ferry
run_shapes "kafka (acked)" 64
stop_ferry
start_ferry --set receivers.otlp.wait_for_ack=false
run_shapes "kafka (fire and forget)" 32
stop_ferry
