//! Compiles the Jumpstarter `.proto` files with `protox` (pure Rust, no
//! `protoc` needed), stores the encoded `FileDescriptorSet` in
//! `$OUT_DIR/jumpstarter_descriptor.bin` and generates prost messages plus
//! tonic clients and servers from it.

use std::path::PathBuf;

use prost::Message as _;

/// The proto files making up the Jumpstarter 0.9.0 protocol (relative to `proto/`), plus
/// upstream main's `telemetry.proto` (a service added after 0.9.0).
const PROTO_FILES: [&str; 6] = [
    "jumpstarter/v1/common.proto",
    "jumpstarter/v1/kubernetes.proto",
    "jumpstarter/v1/jumpstarter.proto",
    "jumpstarter/v1/router.proto",
    "jumpstarter/client/v1/client.proto",
    "jumpstarter/v1/telemetry.proto",
];

/// Our own admin API (not upstream).
const ADMIN_FILE: &str = "jumpstarter/admin/v1/admin.proto";

/// Our own extensions of the client API (not upstream), compiled with the admin API.
const EXT_FILE: &str = "jumpstarter/ext/v1/ext.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let proto_dir = manifest_dir.join("proto");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);

    println!("cargo:rerun-if-changed={}", proto_dir.display());
    for file in PROTO_FILES {
        println!("cargo:rerun-if-changed={}", proto_dir.join(file).display());
    }

    // Files are given relative to the include path so that descriptor file
    // names are e.g. `jumpstarter/v1/common.proto`, exactly as upstream.
    let fds = protox::compile(PROTO_FILES, [&proto_dir]).map_err(|e| format!("protox: {e:?}"))?;

    std::fs::write(
        out_dir.join("jumpstarter_descriptor.bin"),
        fds.encode_to_vec(),
    )?;

    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .emit_rerun_if_changed(false)
        // Stream payloads as `Bytes`: decoded without a copy out of the receive buffer.
        .bytes(".jumpstarter.v1.StreamRequest.payload")
        .bytes(".jumpstarter.v1.StreamResponse.payload")
        .compile_fds(fds)?;

    // Our own admin API, compiled into its own descriptor set so the upstream one above
    // stays the upstream files. It refers to jumpstarter.v1 types, which the
    // generated code reaches through `super::super::super::v1` (see lib.rs nesting).
    for file in [ADMIN_FILE, EXT_FILE] {
        println!("cargo:rerun-if-changed={}", proto_dir.join(file).display());
    }
    let admin = protox::compile([ADMIN_FILE, EXT_FILE], [&proto_dir])
        .map_err(|e| format!("protox: {e:?}"))?;
    std::fs::write(out_dir.join("admin_descriptor.bin"), admin.encode_to_vec())?;
    // The jumpstarter.v1 files come along as imports: their messages are the extern ones
    // above, and their services (telemetry.proto's) must not be generated a second time
    // (that would replace the first compile's jumpstarter.v1 code).
    let mut admin = admin;
    for file in &mut admin.file {
        if file.package() == "jumpstarter.v1" {
            file.service.clear();
        }
    }
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .emit_rerun_if_changed(false)
        .extern_path(".jumpstarter.v1", "crate::jumpstarter::v1")
        .compile_fds(admin)?;

    Ok(())
}
