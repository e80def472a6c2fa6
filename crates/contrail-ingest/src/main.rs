//! `ingest`: the front door of contrail. See the `contrail_ingest` crate docs.

/// mimalloc: ingest is allocation-heavy (JSON values per record); see docs/BENCHMARKS.md.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    contrail_ingest::cli::main(contrail_common::version_text!())
}
