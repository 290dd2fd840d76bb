//! The workspace xtask works in: its root, cargo's target directory, and running cargo
//! there.

use anyhow::{Result, bail};

/// Runs a command from the workspace root, failing on a non-zero exit.
pub fn cargo(args: &[&str]) -> Result<()> {
    cargo_with_env(args, &[])
}

/// [`cargo`] with extra environment variables.
pub fn cargo_with_env(args: &[&str], env: &[(&str, &str)]) -> Result<()> {
    let status =
        std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(args)
            .envs(env.iter().copied())
            .current_dir(workspace_root())
            .status()?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}

/// The workspace root.
pub fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_else(|| ".".into())
}

/// Cargo's target directory (`CARGO_TARGET_DIR` or `<workspace>/target`).
pub fn target_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}
