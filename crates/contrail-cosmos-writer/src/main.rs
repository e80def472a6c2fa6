//! `cosmos-writer`: curated flight states into Azure Cosmos DB. See the `contrail_cosmos_writer`
//! crate docs.

fn main() -> std::process::ExitCode {
    contrail_cosmos_writer::cli::main(contrail_common::version_text!())
}
