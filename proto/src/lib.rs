//! The CRI `runtime.v1` protobuf definitions and their tonic client and server.
//!
//! Empty until the CRI runtime work lands.
