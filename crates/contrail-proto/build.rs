//! Compiles `proto/` with a vendored `protoc`, so a fresh machine needs no system protobuf compiler.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Relative to the package (a build script's working directory): the paths cargo keeps for
    // `rerun-if-changed` are then the same in every clone, and a new clone of unchanged sources
    // reuses the generated code (scripts/tree_mtimes.py) instead of rebuilding every crate.
    let proto_root = PathBuf::from("../../proto");
    let protos = [
        "contrail/v1/events.proto",
        "contrail/ingest/v1/ingest.proto",
        "contrail/admin/v1/admin.proto",
        "contrail/state/v1/dedup.proto",
        "contrail/control/v1/control.proto",
    ];
    // A system protoc wins if the caller points at one; otherwise use the vendored binary.
    if std::env::var_os("PROTOC").is_none() {
        let vendored = protoc_bin_vendored::protoc_bin_path()?;
        // set_var is unsafe in edition 2024; build scripts run single-threaded here.
        #[allow(unsafe_code)]
        unsafe {
            std::env::set_var("PROTOC", vendored);
        }
    }
    let descriptor_path = PathBuf::from(std::env::var("OUT_DIR")?).join("contrail_descriptor.bin");
    let proto_paths: Vec<PathBuf> = protos.iter().map(|p| proto_root.join(p)).collect();
    tonic_prost_build::configure()
        .file_descriptor_set_path(&descriptor_path)
        .compile_protos(&proto_paths, std::slice::from_ref(&proto_root))?;
    // The files, not their directory: cargo takes a directory's own modification time into
    // account, and a new clone's directories are all new.
    for path in &proto_paths {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    Ok(())
}
