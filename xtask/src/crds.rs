//! `cargo xtask crds [--out DIR | --check DIR]`: the controller's CustomResourceDefinitions.
//!
//! Runs the controller crate's `crds` example, so xtask itself does not link the controller:
//! without arguments it prints the YAML (for `kubectl apply -f -`), `--out DIR` writes one
//! `<group>_<plural>.yaml` per kind, and `--check DIR` compares with existing CRD files
//! (e.g. upstream's) and fails on differences that are not explicitly allowed.

use anyhow::{Result, bail};

/// Runs the task with the arguments after `crds`.
pub fn run(args: &[String]) -> Result<()> {
    let mut cargo_args = vec![
        "run",
        "--quiet",
        "-p",
        "jumpstarter-controller",
        "--example",
        "crds",
        "--",
    ];
    // The example runs from the workspace root: hand it an absolute path.
    let dir;
    match args {
        [] => {}
        [flag, given] if flag == "--out" || flag == "--check" => {
            dir = std::path::absolute(given)?.display().to_string();
            cargo_args.push(flag);
            cargo_args.push(&dir);
        }
        _ => bail!(
            "usage: cargo xtask crds [--out DIR | --check DIR] (got {})",
            args.join(" ")
        ),
    }
    crate::cargo(&cargo_args)
}
