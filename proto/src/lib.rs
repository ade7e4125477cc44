//! The CRI `runtime.v1` protobuf definitions and their tonic client and server.
//!
//! [`runtime::v1`] holds the messages, `runtime_service_client`/`image_service_client` for nodewarden's CRI runtime
//! and CLI, and `runtime_service_server`/`image_service_server` for the scripted stand-in runtime of the tests.

/// The CRI `runtime.v1` package.
pub mod runtime {
    /// Generated from `proto/runtime/v1/api.proto`.
    #[allow(missing_docs, unused_qualifications, clippy::all, clippy::pedantic)]
    pub mod v1 {
        tonic::include_proto!("runtime.v1");
    }
}

pub use runtime::v1;
