//! `dedup-state`: the stateful stage of contrail. See the `contrail_dedup_state` crate docs.

/// mimalloc: protobuf decoding and encoding allocate per record.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    contrail_dedup_state::cli::main(contrail_common::version_text!())
}
