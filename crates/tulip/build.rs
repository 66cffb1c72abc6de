//! Compiles protos/tulip.proto with protox, so that no system protoc is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../protos");
    println!("cargo:rerun-if-changed={proto_dir}/tulip.proto");
    let descriptors = protox::compile(["tulip.proto"], [proto_dir])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
