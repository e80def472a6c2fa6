#!/usr/bin/env bash
# The large chaos run of the exactly-once work (not part of CI: about an hour on 2 cores).
# `contrail up` replays five months of real flights (> 1,000,000 deliveries) while every stage is
# killed with SIGKILL at least 10 times, the broker is restarted (kill -9) twice (its data on disk, SQLite)
# and dedup-state loses its volume once (it restores the newest checkpoint); then the test checks
# every store against its own expectation computed from the raw topic: nothing lost, nothing
# applied twice in Cosmos DB, Delta Lake or the change topic. The output goes to
# docs/chaos-large-run.txt.
#
# The broker restart needs the durable broker (nisshi on SQLite), which scripts/setup.sh builds
# once per machine (CONTRAIL_NISSHI_BIN).
#
# --memory-broker: the broker keeps its data in memory and is not restarted (everything else as
# above), as the runs before the durable broker existed did (docs/TESTING.md).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
if [ "${1:-}" = "--memory-broker" ]; then
  export CONTRAIL_CHAOS_LARGE_BROKER=memory
fi
cargo build --workspace --all-targets
log=$(mktemp)
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
status=0
cargo nextest run --workspace --run-ignored only -E 'test(a_large_chaos_run)' --no-capture 2>&1 | tee "$log" || status=$?
{
  echo "# scripts/chaos-large.sh ${1:-} — started $started, exit status $status"
  echo "# machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB; profile: dev (workspace crates' hot path at opt-level 2)"
  echo
  grep -v '^\s*Compiling\|^\s*Finished\|^\s*Running\|^\s*Starting' "$log" | sed 's/\x1b\[[0-9;]*m//g' | uniq
} > docs/chaos-large-run.txt
echo "chaos-large: output in docs/chaos-large-run.txt (exit status $status)"
exit "$status"
