#!/usr/bin/env bash
# Runs every fuzz target for FUZZTIME each (default 2m). Failing inputs are
# written under the package's testdata/fuzz and become regression tests.
set -euo pipefail
cd "$(dirname "$0")/.."
t=${FUZZTIME:-2m}
for target in \
  "FuzzDecode ./receiver/httpreceiver" \
  "FuzzTraces ./otlp/wire" \
  "FuzzLogsAndMetrics ./otlp/wire" \
  "FuzzEncode ./otlp/flatjson" \
  "FuzzOTLPHTTP ./receiver/otlpreceiver" \
  "FuzzFrames ./buffer/spool"; do
  set -- $target
  echo "-- $1 ($2) for $t"
  go test -run='^$' -fuzz="^$1\$" -fuzztime="$t" "$2" 2>&1 | tail -15
done
