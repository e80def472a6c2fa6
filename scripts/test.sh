#!/usr/bin/env bash
# The test command of the README: sets up a fresh machine, builds the stage binaries, runs every
# test (unit, property, and cross-service tests against a real tansu broker). Each step prints
# its wall time.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
started=$SECONDS
cargo build --workspace --all-targets
echo "== build took $((SECONDS - started)) s"
started=$SECONDS
cargo nextest run --workspace --no-fail-fast "$@"
echo "== test run took $((SECONDS - started)) s"
