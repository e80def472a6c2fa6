#!/usr/bin/env bash
# The README's first command: installs what is missing (scripts/setup.sh), builds the workspace, and
# runs `contrail up` — the whole platform on this machine with a replay of real flights (January
# 2013 by default) and the live flight board at http://127.0.0.1:8000/. Arguments go to
# `contrail up` (see `contrail up --help`), e.g.:
#   scripts/up.sh --chaos                      # kill -9 a random stage every 4 s
#   scripts/up.sh --from 2013-06-01 --to 2013-06-30 --rate 5000
set -euo pipefail
cd "$(dirname "$0")/.."
# What the build needs first; the broker and the other tools install in the background meanwhile.
CONTRAIL_SETUP_ONLY=build
source scripts/setup.sh
setup_tools_start
# Only what `contrail up` runs: the binaries. The test command's build (`--all-targets`) reuses
# every artifact of this one, because both resolve the same features
# (tests/tests/build_sharing.rs).
restore_tree_mtimes
started=$SECONDS
cargo build --workspace --bins
echo "== build took $((SECONDS - started)) s"
record_tree_mtimes
setup_tools_finish
exec "$CARGO_TARGET_DIR/debug/contrail" up "$@"
