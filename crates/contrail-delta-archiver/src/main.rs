//! `delta-archiver`: the pipeline's topics into Delta Lake history. See the
//! `contrail_delta_archiver` crate docs.

fn main() -> std::process::ExitCode {
    contrail_delta_archiver::cli::main(contrail_common::version_text!())
}
