//! Descriptor conformance check of `jumpstarter-proto` against the upstream
//! `jumpstarter-protocol==0.9.0` Python package.
//!
//! The heavy lifting is done by `xtask/interop/conformance.py`, which must run
//! under a Python interpreter that can `import jumpstarter_protocol` (e.g. a venv
//! with `pip install jumpstarter-protocol==0.9.0`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

/// Path of the Python conformance script inside the xtask crate.
pub fn script_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("interop")
        .join("conformance.py")
}

/// Runs the descriptor conformance check.
///
/// Writes our descriptor set (`jumpstarter_proto::FILE_DESCRIPTOR_SET`, through the
/// `descriptor_set` example of the workspace's debug build) to `work_dir/ours.bin`, then
/// runs `python conformance.py ours.bin --self-test` once with `work_dir`
/// as the current directory: a structural comparison with the upstream
/// descriptors, then a check that deliberate mutations of ours are reported.
/// The script's output (one report) is passed through.
///
/// # Errors
///
/// Fails if `work_dir` cannot be written, the script is missing, `python`
/// cannot be started, or the run exits unsuccessfully (descriptor
/// differences, a mutation not caught, or `jumpstarter_protocol` not
/// importable).
pub fn run(python: &Path, work_dir: &Path) -> anyhow::Result<()> {
    let script = script_path();
    if !script.is_file() {
        bail!("conformance script not found at {}", script.display());
    }
    std::fs::create_dir_all(work_dir)
        .with_context(|| format!("creating work dir {}", work_dir.display()))?;
    let ours = work_dir.join("ours.bin");
    let example = crate::debug_build()?.join("examples/descriptor_set");
    let status = Command::new(&example)
        .arg(&ours)
        .status()
        .with_context(|| format!("starting {}", example.display()))?;
    if !status.success() {
        bail!("{} failed ({status})", example.display());
    }

    // One run: with `--self-test` the script compares first (printing its report once),
    // then checks that deliberate mutations are caught.
    let what = "descriptor conformance check and self-test";
    let status = Command::new(python)
        .arg(&script)
        .arg("ours.bin")
        .arg("--self-test")
        .current_dir(work_dir)
        .status()
        .with_context(|| {
            format!(
                "{what}: failed to start {} {}",
                python.display(),
                script.display()
            )
        })?;
    if !status.success() {
        bail!(
            "{what} failed ({status}): `{} {} ours.bin --self-test` in {} \
             (see the differences printed above; the interpreter needs \
             `jumpstarter-protocol==0.9.0` installed)",
            python.display(),
            script.display(),
            work_dir.display()
        );
    }
    Ok(())
}
