#!/usr/bin/env bash
# The delivery modes side by side: the same load (100-byte records, 32
# concurrent requests of 1000 NDJSON records, DURATION each) through ferry
# with delivery kafka (memory), spool + fsync interval, spool + fsync always
# and spill, against one local Kafka; each agent's CPU and peak RSS are read
# from /proc. Prints a markdown table (BENCHMARKS.md "Delivery modes").
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-15s}
port=${PORT:-39292}
work=$(mktemp -d /tmp/ferry-bench-spool.XXXXXX)
pid=""
cleanup() {
  [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  scripts/kafka-local stop --port "$port" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
go build -o bin/ferry ./cmd/ferry
go build -o bin/ferry-bench ./cmd/ferry-bench
scripts/kafka-local start --port "$port"
cpu_ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
metric() { curl -fs http://127.0.0.1:18089/metrics | awk -v m="$1" '$1 == m {printf "%.0f", $2}'; }
sent() { curl -fs http://127.0.0.1:18089/metrics | awk '/^ferry_exporter_sent_records_total/ {s += $2} END {printf "%.0f", s}'; }
tck=$(getconf CLK_TCK)
rows=()
run() { # name, then --set overrides
  local name=$1; shift
  local topic="bench-$name-$(date +%s)"
  bin/ferry-bench topic create --bootstrap-server 127.0.0.1:$port --topic "$topic" --partitions 3 >/dev/null
  local sets=(--set exporter.kafka.brokers=[127.0.0.1:$port] --set receivers.http.listen=127.0.0.1:18088
    --set telemetry.admin.listen=127.0.0.1:18089 --set receivers.otlp.enabled=false
    --set delivery.spool.dir="$work/spool-$name" --set delivery.dead_letter.file="$work/dead-$name.ndjson")
  for s in "$@"; do sets+=(--set "$s"); done
  bin/ferry run "${sets[@]}" >"$work/$name.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do curl -fs http://127.0.0.1:18089/readyz >/dev/null 2>&1 && break; sleep 0.1; done
  echo "== $name: $DURATION through ferry ($*)"
  local c0 t0 c1 t1 s0 s1 drain
  c0=$(cpu_ticks "$pid"); t0=$(date +%s.%N); s0=$(sent)
  bin/ferry-bench produce --target http://127.0.0.1:18088 --topic "$topic" --record-size 100 \
    --num-records 1000000000 --duration "$DURATION" --batch 1000 --concurrency 32 --report-json "$work/$name.json"
  c1=$(cpu_ticks "$pid"); t1=$(date +%s.%N); s1=$(sent)
  # With a spool, clients are answered before Kafka: wait for the backlog.
  local d0; d0=$(date +%s.%N)
  while [ "$(metric ferry_spool_backlog_bytes)" != "0" ] && [ "$(metric ferry_spool_backlog_bytes)" != "" ]; do sleep 0.2; done
  drain=$(awk -v a="$d0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
  local kafka_rps; kafka_rps=$(awk -v a="$s0" -v b="$s1" -v x="$t0" -v y="$t1" 'BEGIN{printf "%.0f", (b-a)/(y-x)}')
  local rss cpu
  rss=$(awk '/VmHWM/{printf "%.0f", $2/1024}' "/proc/$pid/status")
  cpu=$(awk -v c="$((c1 - c0))" -v t="$tck" -v a="$t0" -v b="$t1" 'BEGIN{printf "%.0f", 100*c/t/(b-a)}')
  kill -TERM "$pid"; wait "$pid" || true; pid=""
  rows+=("$name|$*|$(jq -r '[.records_per_sec, .mb_per_sec, .p50_ms, .p99_ms] | @tsv' "$work/$name.json" | tr '\t' '|')|$cpu|$rss|$kafka_rps|$drain")
}
# Warm the broker's JVM first, or whichever mode runs first looks slow.
DURATION_SAVED=$DURATION; DURATION=${WARMUP:-5s}
run warmup delivery.mode=kafka >/dev/null
rows=(); DURATION=$DURATION_SAVED
run kafka delivery.mode=kafka
run spool-interval delivery.mode=spool delivery.spool.fsync=interval
run spool-always delivery.mode=spool delivery.spool.fsync=always
run spill delivery.mode=spill
base=$(echo "${rows[0]}" | cut -d'|' -f3)
echo
echo "| delivery | settings | acknowledged to clients, records/s | MB/s | vs kafka mode | into Kafka meanwhile, records/s | backlog drained after load | p50 ms | p99 ms | agent CPU % | agent peak RSS MiB |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for r in "${rows[@]}"; do
  IFS='|' read -r name settings rps mbs p50 p99 cpu rss krps drain <<<"$r"
  awk -v n="$name" -v s="$settings" -v r="$rps" -v m="$mbs" -v b="$base" -v p5="$p50" -v p9="$p99" -v c="$cpu" -v x="$rss" -v k="$krps" -v d="$drain" \
    'BEGIN{printf "| %s | `%s` | %.0f | %.1f | %.2f× | %.0f | %s s | %.1f | %.1f | %s | %s |\n", n, s, r, m, r/b, k, d, p5, p9, c, x}'
done
