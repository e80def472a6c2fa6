#!/usr/bin/env bash
# The test command of the README: sets up a fresh machine, builds the stage binaries, runs every
# test (unit, property, and cross-service tests against a real tansu broker). Each step prints
# its wall time.
set -euo pipefail
cd "$(dirname "$0")/.."
# What the build needs first; the test tools install in the background while it compiles.
CONTRAIL_SETUP_ONLY=build
source scripts/setup.sh
setup_tools_start
restore_tree_mtimes
started=$SECONDS
cargo build --workspace --all-targets
echo "== build took $((SECONDS - started)) s"
record_tree_mtimes
setup_tools_finish
started=$SECONDS
cargo nextest run --workspace --no-fail-fast "$@"
echo "== test run took $((SECONDS - started)) s"
