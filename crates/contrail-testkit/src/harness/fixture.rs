//! Fixtures: unique names and directories per test, reproducible kill moments, the clone's root.

use std::path::PathBuf;

/// The root of the clone the tests run from: the nearest directory holding `Cargo.lock` above
/// the running test's package (`CARGO_MANIFEST_DIR`, which cargo and nextest set when they run a
/// test), else above the working directory.
///
/// Found at run time, never compiled in: every clone of the same sources shares one build
/// (scripts/tree_mtimes.py), so a path compiled in could name another, maybe deleted, clone.
pub fn workspace_root() -> PathBuf {
    let starts = [
        std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from),
        std::env::current_dir().ok(),
    ];
    starts
        .into_iter()
        .flatten()
        .find_map(|start| {
            start
                .ancestors()
                .find(|dir| dir.join("Cargo.lock").is_file())
                .map(PathBuf::from)
        })
        .expect("run from a clone: no Cargo.lock above CARGO_MANIFEST_DIR or the working directory")
}

/// A unique suffix for topic names and directories of one test.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}-{}-{nanos}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    )
}

/// A small deterministic generator for kill moments (the seed is printed for reproduction).
pub struct Moments(pub u64);

impl Moments {
    /// Seeded from the clock; prints the seed.
    pub fn from_clock() -> Moments {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|elapsed| elapsed.as_nanos() as u64 | 1)
            .unwrap_or(0x2013);
        println!("kill moments seed: {seed:#x}");
        Moments(seed)
    }

    /// A number of milliseconds in `low..high`.
    pub fn next_ms(&mut self, low: u64, high: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        low + self.0 % (high - low)
    }
}

/// A fresh directory under the system temp dir.
pub fn test_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(unique(name));
    std::fs::create_dir_all(&dir).expect("test dir");
    dir
}
