//! Compiles protos/tulip.proto with protox, so that no system protoc is needed.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Read when the script runs, not when it is compiled: a build script binary may be reused
    // for a checkout in another folder that shares the target directory.
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let proto_dir = manifest_dir.join("../../protos");
    println!(
        "cargo:rerun-if-changed={}",
        proto_dir.join("tulip.proto").display()
    );
    let descriptors = protox::compile(["tulip.proto"], [&proto_dir])?;
    tonic_prost_build::configure()
        // A message that does not decode is the sender's mistake (src/codec.rs).
        .codec_path("crate::codec::StrictCodec")
        // The engine reports its ModelInfo as a JSON object of the proto's field names (ROSE's
        // Engine.describe()); /info and Python's tulip.Client read it back the same way.
        .type_attribute(
            "tulip.v1.ModelInfo",
            "#[derive(serde::Serialize, serde::Deserialize)] #[serde(deny_unknown_fields)]",
        )
        .compile_fds(descriptors)?;
    Ok(())
}
