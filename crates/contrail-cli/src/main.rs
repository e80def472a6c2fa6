//! `contrail`: the command-line tool of the contrail platform. See the `contrail_cli` crate docs.

/// mimalloc, as in every contrail binary (the stages are allocation-heavy; docs/BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    contrail_cli::main(contrail_common::version_text!())
}
