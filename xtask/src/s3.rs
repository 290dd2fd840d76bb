//! `cargo xtask s3`: the Opendal driver's S3 service, built only with the `storage-s3`
//! feature (so a plain `cargo test --workspace` never compiles it), linted and tested
//! against moto's S3 server on loopback (`xtask/interop/moto_s3.py`, from a venv of its
//! own). `cargo xtask ci` builds with the feature and runs these tests with the others.

use anyhow::Result;

use crate::{cargo, cargo_with_env, interop::venv_with};

/// moto's S3 server, pinned.
const REQUIREMENTS: &[&str] = &["moto[server]==5.2.5"];

/// The venv with moto (created once).
pub fn venv() -> Result<std::path::PathBuf> {
    venv_with("s3-venv", REQUIREMENTS)
}

/// Lints the feature's code and runs its tests.
pub fn run() -> Result<()> {
    let venv = venv()?;
    println!("== cargo clippy -D warnings, jumpstarter-drivers with storage-s3");
    let feature = ["-p", "jumpstarter-drivers", "--features", "storage-s3"];
    cargo(
        &[
            &["clippy"],
            &feature[..],
            &["--all-targets", "--", "-D", "warnings"],
        ]
        .concat(),
    )?;
    println!("== Opendal(s3) against moto's S3 server");
    let python = venv.join("bin/python");
    cargo_with_env(
        &[&["test"], &feature[..], &["--test", "it", "s3::"]].concat(),
        &[("JMP_TEST_S3_PYTHON", &python.to_string_lossy())],
    )
}
