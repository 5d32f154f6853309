#!/usr/bin/env bash
# Runs every fuzz target for FUZZTIME each (default 2m). Failing inputs are
# written under the package's testdata/fuzz and become regression tests.
#
# New-coverage inputs are minimised for at most FUZZMINIMIZE executions
# (default 200x): go test's default of 60 s per input spends a whole short
# run minimising, which is why the smoke runs used to report 0 execs/s after
# the baseline and test almost nothing. Each target must execute at least
# MIN_EXECS inputs (default 1000), or the run fails.
#
# FUZZTIME is a duration (2m) or a count of inputs (50000x). With a duration,
# go1.26's coordinator can end a run that found nothing with a bare
# "context deadline exceeded" (go.dev/issue/75804, fixed in go1.27); such a
# run is accepted when no failing input was written and it ran enough inputs.
# Any other failure, or a written failing input, fails the run.
#
# A target listed with a third field, a count (5000x), runs at most that
# many inputs when FUZZTIME is a count: those that serve each input over a
# socket or open a spool directory with it run a few hundred to a few
# thousand inputs a second, and make test's 20000x would take minutes each.
# A duration FUZZTIME (make fuzz) applies to every target alike.
set -euo pipefail
cd "$(dirname "$0")/.."
t=${FUZZTIME:-2m}
minimize=${FUZZMINIMIZE:-200x}
min_execs=${MIN_EXECS:-1000}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# deadline_race LOG: the failure is only the coordinator's deadline race: a
# duration budget, the one error line, and nothing written or panicking.
deadline_race() {
  case "$t" in *x) return 1 ;; esac
  grep -q '^    context deadline exceeded$' "$1" || return 1
  ! grep -qE 'Failing input written|panic:|_test\.go:[0-9]+:' "$1" || return 1
  [ "$(grep -c '^--- FAIL' "$1")" -eq 1 ]
}
for target in \
  "FuzzDecode ./receiver/httpreceiver" \
  "FuzzTraces ./otlp/wire" \
  "FuzzLogsAndMetrics ./otlp/wire" \
  "FuzzEncode ./otlp/flatjson" \
  "FuzzSplitBounded ./otlp/encoding" \
  "FuzzDecodeCost ./otlp/encoding 20000x" \
  "FuzzRemoteWrite ./otlp/prom" \
  "FuzzPush ./otlp/prom 20000x" \
  "FuzzOTLPHTTP ./receiver/otlpreceiver" \
  "FuzzOTLPHTTPCompressed ./receiver/otlpreceiver 10000x" \
  "FuzzOTLPGRPC ./receiver/otlpreceiver 5000x" \
  "FuzzConvert ./otlp/zipkin 20000x" \
  "FuzzFrames ./buffer/spool" \
  "FuzzResync ./buffer/spool" \
  "FuzzCheckpoint ./buffer/spool 5000x" \
  "FuzzSegmentHeader ./buffer/spool 5000x" \
  "FuzzKeyLog ./buffer/spool" \
  "FuzzDecode ./protocol" \
  "FuzzSplitRequestID ./protocol 20000x" \
  "FuzzParseID ./receipt 20000x" \
  "FuzzVerify ./auth/token" \
  "FuzzProduce ./receiver/kafkafront" \
  "FuzzRefusal ./receiver/kafkafront" \
  "FuzzProduceSequences ./receiver/kafkafront" \
  "FuzzProduceSequencesDurable ./receiver/kafkafront 5000x" \
  "FuzzRequestHeader ./receiver/kafkafront 10000x" \
  "FuzzMetadata ./receiver/kafkafront 10000x" \
  "FuzzSASLPlain ./receiver/kafkafront 10000x" \
  "FuzzTextMode ./receiver/localreceiver" \
  "FuzzFrame ./receiver/filereceiver" \
  "FuzzMultiline ./receiver/filereceiver 20000x" \
  "FuzzJSONFields ./receiver/filereceiver 20000x" \
  "FuzzRFC5424 ./receiver/syslogreceiver 10000x" \
  "FuzzRFC3164 ./receiver/syslogreceiver 10000x" \
  "FuzzFrame ./receiver/syslogreceiver 10000x" \
  "FuzzConvert ./otlp/jaeger 10000x" \
  "FuzzConvertProto ./otlp/jaeger 10000x" \
  "FuzzLZ4 ./lz4frame" \
  "FuzzLZ4Block ./lz4frame"; do
  set -- $target
  tt=$t
  case "$t" in *x) if [ $# -ge 3 ] && [ "${t%x}" -gt "${3%x}" ]; then tt=$3; fi ;; esac
  echo "-- $1 ($2) for $tt"
  # lz4check: the lz4 encoder's unchecked loads are checked (lz4_load.go).
  if ! go test -tags lz4check -run='^$' -fuzz="^$1\$" -fuzztime="$tt" -fuzzminimizetime="$minimize" "$2" >"$log" 2>&1; then
    if deadline_race "$log"; then
      echo "   $1: the run ended with go1.26's fuzztime deadline race (go.dev/issue/75804), no failing input"
    else
      tail -40 "$log"
      exit 1
    fi
  fi
  tail -3 "$log"
  # Inputs run: the fuzzing execs, or the corpus replayed as the baseline
  # when a large cached corpus took the whole run.
  execs=$(grep -o 'execs: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || true)
  [ -n "$execs" ] || execs=$(grep -o 'baseline coverage: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || echo 0)
  if [ "${execs:-0}" -lt "$min_execs" ]; then
    echo "fuzz: $1 executed only ${execs:-0} inputs in $tt (at least $min_execs wanted)"
    exit 1
  fi
  echo "   $1: $execs inputs"
done
