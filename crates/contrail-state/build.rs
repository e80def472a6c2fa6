//! No build steps. The build-dependency on `cc` exists only to enable its `parallel` feature for
//! librocksdb-sys's build script (see the workspace Cargo.toml): RocksDB's C++ then compiles on every
//! core, and adding the Azure SDK later does not change `cc`'s features (which would rebuild RocksDB).
fn main() {}
