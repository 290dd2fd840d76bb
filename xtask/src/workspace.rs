//! The workspace xtask works in: its root, cargo's target directory, the cache outside
//! the checkout, and running cargo there.
//!
//! Every task that needs the workspace's debug binaries or examples gets them from one
//! build, [`debug_build`]: the build of `cargo test --workspace` with [`TEST_FEATURES`]
//! (its binaries, its examples, its test programs).
//! Building one package alone (`cargo build -p jumpstarter-cli`) would resolve the
//! dependencies' features for that package only, and so rebuild tokio and most of the tree
//! next to what `cargo test --workspace` built; one feature set for every build of a run
//! compiles each crate once.

use std::{
    path::PathBuf,
    process::Command,
    sync::{Mutex, OnceLock},
};

use anyhow::{Context, Result, bail};

/// Features every workspace build xtask makes turns on, so that one build serves `cargo
/// xtask ci` from the lints to the last suite: the Opendal driver's S3 service, whose tests
/// run against moto.
pub const TEST_FEATURES: &str = "jumpstarter-drivers/storage-s3";

/// `clippy-driver`, when the workspace's own crates are compiled through it (see
/// [`lint_while_building`]).
static CLIPPY_DRIVER: OnceLock<PathBuf> = OnceLock::new();

/// From now on, this process compiles the workspace's own crates with `clippy-driver` as
/// `RUSTC_WORKSPACE_WRAPPER`: one build both compiles them and reports clippy's lints (what
/// `cargo clippy` reports, without its separate check build of every dependency). Every
/// cargo command of this process then passes the same wrapper, so that none rebuilds them.
pub fn lint_while_building() -> Result<()> {
    let driver = clippy_driver()?;
    let _ = CLIPPY_DRIVER.set(driver);
    Ok(())
}

/// `clippy-driver` of the toolchain running us: beside `$CARGO`, else on `PATH`.
fn clippy_driver() -> Result<PathBuf> {
    let beside_cargo = std::env::var_os("CARGO")
        .map(PathBuf::from)
        .and_then(|c| c.parent().map(|d| d.join("clippy-driver")))
        .filter(|p| p.is_file());
    if let Some(p) = beside_cargo {
        return Ok(p);
    }
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("clippy-driver"))
                .find(|p| p.is_file())
        })
        .context("clippy-driver not found beside cargo or on PATH (rustup component add clippy)")
}

/// A `cargo ARGS` command from the workspace root (with the lint wrapper when set).
pub fn cargo_command(args: &[&str]) -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.args(args).current_dir(workspace_root());
    if let Some(driver) = CLIPPY_DRIVER.get() {
        c.env("RUSTC_WORKSPACE_WRAPPER", driver);
    }
    c
}

/// Runs a command from the workspace root, failing on a non-zero exit.
pub fn cargo(args: &[&str]) -> Result<()> {
    cargo_with_env(args, &[])
}

/// [`cargo`] with extra environment variables.
pub fn cargo_with_env(args: &[&str], env: &[(&str, &str)]) -> Result<()> {
    let status = cargo_command(args)
        .envs(env.iter().copied())
        .status()
        .context("cannot start cargo")?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}

/// Whether [`debug_build`] ran in this process already.
static BUILT: Mutex<bool> = Mutex::new(false);

/// The arguments of the workspace's one debug build: what `cargo test --workspace` builds
/// (libraries, binaries, test programs, and the examples as programs), with
/// [`TEST_FEATURES`]. Exactly these, so that no step builds anything another did not.
pub const DEBUG_BUILD: [&str; 6] = [
    "test",
    "--workspace",
    "--no-run",
    "--features",
    TEST_FEATURES,
    "--quiet",
];

/// The workspace's debug build ([`DEBUG_BUILD`]), once per process; returns `target/debug`,
/// where the binaries and the examples are.
pub fn debug_build() -> Result<PathBuf> {
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if !*built {
        cargo(&DEBUG_BUILD)?;
        *built = true;
    }
    Ok(target_dir().join("debug"))
}

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_else(|| ".".into())
}

/// Cargo's target directory (`CARGO_TARGET_DIR` or `<workspace>/target`).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// Where what the tests need from outside is kept between runs and checkouts, each thing
/// under a name that carries its version (the API server and etcd, the venvs, the QEMU
/// board): `$XDG_CACHE_HOME/jumpstarter-rs`, else `~/.cache/jumpstarter-rs`.
pub fn cache_root() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/tmp"))
        .join("jumpstarter-rs")
}

/// The first 12 hex digits of the SHA-256 of `text`: a cache key for a recipe.
pub fn short_hash(text: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Installs Debian `packages` with `apt-get` (their recommended packages too when
/// `recommends`), after an `apt-get update` when the first try fails (a fresh machine may
/// have no package lists yet); says what it installs, and fails naming `why` they are needed.
pub fn apt_install(packages: &[&str], recommends: bool, why: &str) -> Result<()> {
    println!("== apt-get install {}", packages.join(" "));
    let install = || {
        let mut cmd = Command::new("apt-get");
        cmd.args(["install", "-y"]);
        if !recommends {
            cmd.arg("--no-install-recommends");
        }
        cmd.args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    let ok = install()
        || (Command::new("apt-get")
            .arg("update")
            .status()
            .is_ok_and(|s| s.success())
            && install());
    if !ok {
        bail!(
            "apt-get install {} failed ({why}; run as root)",
            packages.join(" ")
        );
    }
    Ok(())
}
