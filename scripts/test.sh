#!/usr/bin/env bash
# The test command of the README: sets up a fresh machine, builds the stage binaries, runs every
# test (unit, property, and cross-service tests against a real tansu broker).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
cargo build --workspace --all-targets
cargo nextest run --workspace --no-fail-fast "$@"
