#!/usr/bin/env bash
# RocksDB's C++, compiled once per machine and reused by every clone, target directory and lint.
#
# librocksdb-sys compiles RocksDB's 343 C++ files one by one in every target directory and profile:
# about 1,200 CPU-seconds at -O1, the largest unit of a cold build (docs/TESTING.md). Most of that
# is parsing the same headers 343 times. This script compiles the same sources (the crate's own
# list, flags and defines, for the features the workspace enables) as a few unity translation units
# — one per core — and archives them into librocksdb.a in a cache directory outside the clone,
# named by everything the library depends on: the librocksdb-sys and lz4-sys versions, the compiler
# and the flags. librocksdb-sys then links it (ROCKSDB_LIB_DIR, ROCKSDB_STATIC) instead of
# compiling its own; contrail-state's build script fails the build if the directory holds a library
# for another librocksdb-sys version (a stamp file names it).
#
# Prints the library's directory on stdout (progress on stderr). scripts/setup.sh exports it for
# every build the scripts run; for a cargo command of your own, the same environment:
#   export ROCKSDB_LIB_DIR="$(bash scripts/rocksdb.sh)" ROCKSDB_STATIC=1
# The optimisation level is the one argument: -O1 (default: what the dev profile's librocksdb-sys
# uses, for the tests and `contrail up`), -O2 (the release benchmarks, as the figures in
# docs/BENCHMARKS.md were measured) or -O3 (what a release build of librocksdb-sys compiles).
# Each level is its own library.
# Libraries are kept in ${XDG_CACHE_HOME:-~/.cache}/contrail/rocksdb (not a CONTRAIL_ variable:
# those are the stages' configuration keys, and a stage refuses one it does not know).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

fail() {
  echo "rocksdb.sh: $*" >&2
  exit 1
}

opt="${1:--O1}"
case "$opt" in
  -O1 | -O2 | -O3) ;;
  *) fail "usage: rocksdb.sh [-O1|-O2|-O3] (got '$opt'): -O1 for the dev profile, -O2 or -O3 for release benchmarks" ;;
esac
[ $# -le 1 ] || fail "usage: rocksdb.sh [-O1|-O2|-O3] (one argument at most, got $#)"

# The version of a package in Cargo.lock (exactly one expected).
locked_version() {
  awk -v name="$1" '$0 == "name = \"" name "\"" { getline; gsub(/version = |"/, ""); print }' \
    "$root/Cargo.lock"
}

rocksdb_sys="$(locked_version librocksdb-sys)"
lz4_sys="$(locked_version lz4-sys)"
[ -n "$rocksdb_sys" ] && [ "$(wc -l <<<"$rocksdb_sys")" -eq 1 ] ||
  fail "Cargo.lock must hold exactly one librocksdb-sys (found: '${rocksdb_sys}')"
[ -n "$lz4_sys" ] && [ "$(wc -l <<<"$lz4_sys")" -eq 1 ] ||
  fail "Cargo.lock must hold exactly one lz4-sys (found: '${lz4_sys}')"

# The defines below are what librocksdb-sys' build script passes for these features on x86-64
# Linux; another feature (zstd, snappy …) needs its define and include path here.
features="$(grep -E '^rocksdb = ' "$root/Cargo.toml" | sed -E 's/.*features = \[([^]]*)\].*/\1/')"
[ "$features" = '"lz4", "bindgen-runtime"' ] ||
  fail "the workspace's rocksdb features are [$features], this script knows [\"lz4\", \"bindgen-runtime\"]: add the matching defines here"
case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) ;;
  *) fail "only x86-64 Linux is known here ($(uname -s)-$(uname -m)); unset ROCKSDB_LIB_DIR to let librocksdb-sys compile RocksDB" ;;
esac

registry="${CARGO_HOME:-$HOME/.cargo}/registry/src"
# Empty when absent — also on a new machine whose registry directory does not exist yet (find
# fails there, and under pipefail that failure must not end the script without a word).
find_source() {
  [ -d "$registry" ] || return 0
  find "$registry" -mindepth 2 -maxdepth 2 -type d -name "$1" 2>/dev/null | head -1 || true
}
src="$(find_source "librocksdb-sys-$rocksdb_sys")"
lz4="$(find_source "lz4-sys-$lz4_sys")"
if [ -z "$src" ] || [ -z "$lz4" ]; then
  echo "rocksdb.sh: fetching the crates' sources (cargo fetch --locked)" >&2
  (cd "$root" && cargo fetch --locked >&2)
  src="$(find_source "librocksdb-sys-$rocksdb_sys")"
  lz4="$(find_source "lz4-sys-$lz4_sys")"
fi
[ -f "$src/rocksdb_lib_sources.txt" ] || fail "no librocksdb-sys $rocksdb_sys sources under $registry"
[ -f "$lz4/liblz4/lib/lz4.h" ] || fail "no lz4-sys $lz4_sys sources under $registry"

cxx="${CXX:-c++}"
# As librocksdb-sys passes them (in the dev profile: opt-level 1, no debug info; -msse2 is all the
# default x86-64 target enables), plus -w: a unity build repeats every header's warnings.
flags=("$opt" -ffunction-sections -fdata-sections -fPIC -m64 -std=c++20 -include cstdint -w -msse2
  -DNDEBUG=1 -DHAVE_ALIGNED_NEW -DHAVE_UINT128_EXTENSION -DLZ4=1
  -DOS_LINUX -DROCKSDB_PLATFORM_POSIX -DROCKSDB_LIB_IO_POSIX -DROCKSDB_SCHED_GETCPU_PRESENT
  -DROCKSDB_AUXV_GETAUXVAL_PRESENT -DROCKSDB_FALLOCATE_PRESENT -DROCKSDB_RANGESYNC_PRESENT)
compiler="$("$cxx" --version | head -1)"
recipe="unity-1"
key="$(printf '%s\n' "librocksdb-sys $rocksdb_sys" "lz4-sys $lz4_sys" "compiler $compiler" \
  "flags ${flags[*]}" "recipe $recipe" | sha256sum | cut -c1-12)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/contrail/rocksdb"
lib_dir="$cache/$rocksdb_sys-$key"
stamp="$lib_dir/contrail-rocksdb.stamp"

if [ -f "$lib_dir/librocksdb.a" ] && [ -f "$stamp" ]; then
  echo "$lib_dir"
  exit 0
fi

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
if [ -f "$lib_dir/librocksdb.a" ] && [ -f "$stamp" ]; then # another build finished meanwhile
  echo "$lib_dir"
  exit 0
fi

parts="$(nproc)"
[ "$parts" -ge 1 ] || parts=1
[ "$parts" -le 8 ] || parts=8
echo "rocksdb.sh: compiling RocksDB $rocksdb_sys once for this machine ($parts unity parts, ${flags[0]}) into $lib_dir" >&2
started=$SECONDS
work="$(mktemp -d "$cache/.build-XXXXXX")"
trap 'rm -rf "$work"' EXIT

# The crate's source list (without util/build_version.cc: the crate compiles its own pre-generated
# build_version.cc), dealt largest first to the part with the fewest bytes so far; each part then
# includes its files in the list's order (the whole list also compiles as one unit).
{
  grep -v '^util/build_version.cc$' "$src/rocksdb_lib_sources.txt" | sed '/^$/d; s|^|rocksdb/|'
  echo build_version.cc
} | while read -r file; do
  echo "$(stat -c %s "$src/$file") $file"
done | awk '{ print NR, $0 }' | sort -k2,2nr | awk -v parts="$parts" '
  {
    best = 0
    for (i = 1; i < parts; i++) if (load[i] < load[best]) best = i
    load[best] += $2
    print $1, best, $3
  }' | sort -n | while read -r _ part file; do
  echo "#include \"$file\"" >>"$work/part$part.cc"
done

pids=()
for unit in "$work"/part*.cc; do
  (cd "$src" && "$cxx" "${flags[@]}" -I rocksdb/include -I rocksdb -I rocksdb/third-party/gtest-1.8.1/fused-src \
    -I "$lz4/liblz4/lib" -I . -c "$unit" -o "${unit%.cc}.o") 2>"${unit%.cc}.log" &
  pids+=($!)
done
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    cat "$work/part$i.log" >&2
    fail "compiling part $i of RocksDB failed (its compiler output is above)"
  fi
done
ar crs "$work/librocksdb.a" "$work"/part*.o
rm -f "$work"/part*.o "$work"/part*.log
printf '%s\n' "librocksdb-sys $rocksdb_sys" "lz4-sys $lz4_sys" "compiler $compiler" \
  "flags ${flags[*]}" "recipe $recipe ($parts parts)" >"$work/contrail-rocksdb.stamp"
rm -rf "$lib_dir"
mv "$work" "$lib_dir"
trap - EXIT
echo "rocksdb.sh: RocksDB compiled in $((SECONDS - started)) s ($(du -h "$lib_dir/librocksdb.a" | cut -f1)); every later build on this machine reuses it" >&2
echo "$lib_dir"
