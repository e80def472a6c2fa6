//! Guards the RocksDB library the build links.
//!
//! scripts/setup.sh points librocksdb-sys at a RocksDB compiled once per machine
//! (`ROCKSDB_LIB_DIR`, built by scripts/rocksdb.sh) instead of letting it compile its own. Such a
//! directory carries a stamp naming the librocksdb-sys version it was compiled for; a directory
//! without one, or for another version, fails the build here rather than linking RocksDB of
//! another version into the state engine.
//!
//! The build-dependency on `cc` exists only to enable its `parallel` feature for librocksdb-sys's
//! build script when it compiles RocksDB itself (see the workspace Cargo.toml).
use std::env;
use std::fs;
use std::path::Path;

/// The stamp scripts/rocksdb.sh writes beside `librocksdb.a`.
const STAMP: &str = "contrail-rocksdb.stamp";

fn main() {
    println!("cargo::rerun-if-env-changed=ROCKSDB_LIB_DIR");
    println!("cargo::rerun-if-env-changed=ROCKSDB_COMPILE");
    let Some(lib_dir) = env::var_os("ROCKSDB_LIB_DIR") else {
        return; // librocksdb-sys compiles its bundled RocksDB
    };
    if env::var("ROCKSDB_COMPILE").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true")) {
        return; // librocksdb-sys ignores ROCKSDB_LIB_DIR and compiles its own
    }
    let lib_dir = Path::new(&lib_dir);
    let stamp = lib_dir.join(STAMP);
    println!("cargo::rerun-if-changed={}", stamp.display());
    println!(
        "cargo::rerun-if-changed={}",
        lib_dir.join("librocksdb.a").display()
    );

    // librocksdb-sys (`links = "rocksdb"`) tells its direct dependents where its sources are:
    // `…/librocksdb-sys-<version>`.
    let manifest = env::var("DEP_ROCKSDB_CARGO_MANIFEST_DIR")
        .expect("librocksdb-sys names its manifest directory (DEP_ROCKSDB_CARGO_MANIFEST_DIR)");
    let wanted = Path::new(&manifest)
        .file_name()
        .and_then(|name| name.to_str())
        .and_then(|name| name.strip_prefix("librocksdb-sys-"))
        .unwrap_or_else(|| panic!("cannot read librocksdb-sys' version from {manifest}"))
        .to_owned();

    let text = fs::read_to_string(&stamp).unwrap_or_else(|error| {
        panic!(
            "ROCKSDB_LIB_DIR={} has no {STAMP} ({error}): it was not built by scripts/rocksdb.sh \
             for librocksdb-sys {wanted}. Run `export ROCKSDB_LIB_DIR=\"$(bash scripts/rocksdb.sh)\" \
             ROCKSDB_STATIC=1`, or unset ROCKSDB_LIB_DIR to let librocksdb-sys compile RocksDB",
            lib_dir.display()
        )
    });
    let built_for = text
        .lines()
        .find_map(|line| line.strip_prefix("librocksdb-sys "))
        .unwrap_or("nothing");
    if built_for != wanted {
        panic!(
            "ROCKSDB_LIB_DIR={} holds RocksDB for librocksdb-sys {built_for}, this build links \
             librocksdb-sys {wanted}. Run `export ROCKSDB_LIB_DIR=\"$(bash scripts/rocksdb.sh)\" \
             ROCKSDB_STATIC=1` (it compiles the matching library once), or unset ROCKSDB_LIB_DIR",
            lib_dir.display()
        );
    }
}
