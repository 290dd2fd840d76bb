//! The harness binary on its own (`cargo xtask lab-harness` runs it against a lab; this
//! test also makes `cargo test` build the binary that step runs).

use std::process::Command;

#[test]
fn a_missing_client_config_is_a_clear_error_before_any_lease() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nowhere.yaml");
    let image = dir.path().join("image.bin");
    std::fs::write(&image, b"image").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_lab-harness"))
        .args(["-l", "board=none", "--image"])
        .arg(&image)
        .arg("--client-config")
        .arg(&missing)
        .env_remove("JMP_CLIENT_CONFIG")
        .env("HOME", dir.path())
        .env("XDG_CONFIG_HOME", dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success(), "ran without a client config");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("nowhere.yaml"),
        "the error does not name the missing config: {stderr}"
    );
}
