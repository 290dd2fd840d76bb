//! Writes [`jumpstarter_proto::FILE_DESCRIPTOR_SET`] (our protocol's descriptors, with the
//! `google/protobuf` files they import) to the file named by its one argument, or to
//! stdout. `cargo xtask interop` compares it with upstream's `jumpstarter-protocol`.

use std::io::Write;

fn main() -> std::process::ExitCode {
    let written = match std::env::args_os().nth(1) {
        Some(path) => std::fs::write(&path, jumpstarter_proto::FILE_DESCRIPTOR_SET)
            .map_err(|e| format!("{}: {e}", std::path::Path::new(&path).display())),
        None => std::io::stdout()
            .write_all(jumpstarter_proto::FILE_DESCRIPTOR_SET)
            .map_err(|e| format!("stdout: {e}")),
    };
    match written {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("descriptor_set: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
