//! Generated protobuf and gRPC types for contrail.
//!
//! The `.proto` sources live in the repository's top-level `proto/` folder; this crate is the only
//! place they are compiled, so every stage shares one set of types. [`FILE_DESCRIPTOR_SET`] feeds gRPC
//! server reflection, so `grpcurl` works against any stage without the `.proto` files.
#![allow(missing_docs, clippy::all, clippy::unwrap_used)]

/// Wire messages between stages (docs/CONTRACT.md, "Stages and topics").
pub mod v1 {
    tonic::include_proto!("contrail.v1");
}

/// The ingest stage's gRPC API.
pub mod ingest {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("contrail.ingest.v1");
    }
}

/// The admin API every stage serves.
pub mod admin {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("contrail.admin.v1");
    }
}

/// State stored by stateful stages.
pub mod state {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("contrail.state.v1");
    }
}

/// Encoded `FileDescriptorSet` of every contrail proto, for gRPC reflection.
pub mod control {
    pub mod v1 {
        tonic::include_proto!("contrail.control.v1");
    }
}

pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("contrail_descriptor");
