#!/usr/bin/env bash
# make soak: ferry's randomized fault soak (proofs/soak) at length, every
# mode in turn (DURATION of load each, default 30m; MODES=kafka,spool,...
# to choose; SEED to reproduce a run), against a 3-broker cluster on
# ports PORT..PORT+5 (default 29400). A progress line every 10 s; the
# table in docs/reliability.md is rewritten when every mode passed.
#
#   scripts/soak.sh [run]   the soak (DURATION, MODES, SEED, PORT from the environment)
#   scripts/soak.sh deps    install what the netem fault needs (iproute2: tc, ip) when missing
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "soak: $*" >&2; }

deps() {
  if command -v tc >/dev/null && command -v ip >/dev/null; then return 0; fi
  if [ "$(id -u)" != 0 ]; then log "tc/ip missing and not root: the netem fault will be skipped"; return 0; fi
  command -v apt-get >/dev/null || { log "tc/ip missing and no apt-get: the netem fault will be skipped"; return 0; }
  exec 9>/tmp/ferry-iproute2-install.lock
  flock 9
  if ! command -v tc >/dev/null || ! command -v ip >/dev/null; then
    log "installing iproute2 (apt-get, once)"
    if ! apt-cache show iproute2 >/dev/null 2>&1; then apt-get update -qq >&2; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iproute2 >&2 || { log "apt-get install iproute2 failed"; exit 1; }
  fi
  flock -u 9
}

run() {
  deps
  go mod download
  scripts/kafka-local jars
  duration=${DURATION:-30m}
  modes=${MODES:-all}
  log "modes $modes, $duration of load each, cluster on ports ${PORT:-29400}..$(( ${PORT:-29400} + 5 ))"
  out=$(mktemp /tmp/ferry-soak.XXXXXX.log)
  status=0
  env FERRY_SOAK_DURATION="$duration" FERRY_SOAK_MODES="$modes" FERRY_SOAK_KAFKA_PORT="${PORT:-29400}" ${SEED:+FERRY_SOAK_SEED=$SEED} \
    FERRY_SOAK_REPORT="$PWD/docs/reliability.md" \
    go test -count=1 -v -timeout 0 -run 'TestSoak$' ./proofs/soak 2>&1 | tee "$out" |
    grep --line-buffered -E '^(=== RUN|--- |ok|FAIL|PASS)|soak_test.go:[0-9]+:' || status=$?
  if grep -q '^--- FAIL' "$out"; then
    log "FAILED (full output: $out)"
    exit 1
  fi
  log "docs/reliability.md updated (full output: $out)"
  exit "$status"
}

case "${1:-run}" in
  run) run ;;
  deps) deps ;;
  *) echo "usage: scripts/soak.sh [run|deps]" >&2; exit 2 ;;
esac
