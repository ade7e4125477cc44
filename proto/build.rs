//! Compiles `proto/runtime/v1/api.proto` with the pure-Rust protox compiler (no `protoc` needed) and generates the
//! tonic client and server.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/runtime/v1/api.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(fds)?;
    Ok(())
}
