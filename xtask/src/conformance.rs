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
/// Writes [`jumpstarter_proto::FILE_DESCRIPTOR_SET`] to `work_dir/ours.bin`,
/// then runs `python conformance.py ours.bin` (structural comparison with the
/// upstream descriptors) and `python conformance.py ours.bin --self-test`
/// (checks that deliberate mutations of our descriptors are reported), both
/// with `work_dir` as the current directory. The script's output is passed
/// through.
///
/// # Errors
///
/// Fails if `work_dir` cannot be written, the script is missing, `python`
/// cannot be started, or either run exits unsuccessfully (descriptor
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
    std::fs::write(&ours, jumpstarter_proto::FILE_DESCRIPTOR_SET)
        .with_context(|| format!("writing {}", ours.display()))?;

    for extra in [None, Some("--self-test")] {
        let mut cmd = Command::new(python);
        cmd.arg(&script).arg("ours.bin").current_dir(work_dir);
        if let Some(flag) = extra {
            cmd.arg(flag);
        }
        let what = match extra {
            None => "descriptor conformance check",
            Some(_) => "descriptor conformance self-test",
        };
        let status = cmd.status().with_context(|| {
            format!(
                "{what}: failed to start {} {}",
                python.display(),
                script.display()
            )
        })?;
        if !status.success() {
            bail!(
                "{what} failed ({status}): `{} {} ours.bin{}` in {} \
                 (see the differences printed above; the interpreter needs \
                 `jumpstarter-protocol==0.9.0` installed)",
                python.display(),
                script.display(),
                extra.map(|f| format!(" {f}")).unwrap_or_default(),
                work_dir.display()
            );
        }
    }
    Ok(())
}
