//! What came to upstream main after 0.9.0 and is on the wire, against upstream's 0.9.0
//! Python tools, which must be unaffected: the exporter's `motd` (`GetReport` field 5) and
//! the controller's hidden and deprecated labels (`show_hidden_labels`,
//! `deprecated_labels`).

use anyhow::{Result, ensure};

use super::{
    CALL_TIMEOUT, EXPORTER_CONFIG, Env, check,
    controller::{our_admin, py_create_lease, py_jmp, start_controller_with},
    our_direct_exporter_with, path_with_venv,
};
use crate::procs;

/// Upstream's 0.9.0 `jmp shell --tls-grpc -- j power on` against our exporter whose config
/// has a `motd` and whose beforeLease hook adds to it through `$JMP_MOTD_FILE`: the
/// `GetReport` answer it parses carries the new field.
pub(super) fn py_client_to_our_exporter_with_motd(env: &Env) -> Result<()> {
    let config = env.work.path().join("motd-exporter.yaml");
    std::fs::write(
        &config,
        format!(
            "{EXPORTER_CONFIG}motd: |\n  Interop rig.\nhooks:\n  beforeLease:\n    script: |\n      \
             echo \"hook was here\" > \"$JMP_MOTD_FILE\"\n"
        ),
    )?;
    let (_exporter, port) = our_direct_exporter_with(env, &config, &[])?;
    for args in [&["power", "on"][..], &["power", "read"]] {
        let mut c = env.upstream("jmp");
        c.env("PATH", path_with_venv(env))
            .args(["shell", "--tls-grpc", &format!("127.0.0.1:{port}")])
            .args(["--tls-grpc-insecure", "--", "j"])
            .args(args);
        check(
            &procs::run(c, CALL_TIMEOUT)?,
            &format!("(python) jmp shell --tls-grpc -- j {}", args.join(" ")),
        )?;
    }
    Ok(())
}

/// Upstream's 0.9.0 `jmp get exporters`, `jmp create lease`, `jmp get leases` against our
/// controller with `hiddenLabels` and `deprecatedLabels` (`--config`) and an exporter with a
/// `hidden.jumpstarter.dev/` label: hidden labels are left out unless it asks
/// (`--show-hidden-labels`), a lease by a deprecated label is created and listed.
pub(super) fn py_tools_with_hidden_and_deprecated_labels(env: &Env) -> Result<()> {
    let settings = env.work.path().join("labels-controller.yaml");
    std::fs::write(
        &settings,
        "hiddenLabels:\n  keys: [example.com/rack]\ndeprecatedLabels:\n  keys:\n    \
         old-board: use board instead\n",
    )?;
    let settings_s = settings.to_string_lossy().into_owned();
    let (_controller, _endpoint) =
        start_controller_with(env, "labels-controller-data", &["--config", &settings_s])?;
    let dir = env.work.path();
    let client = dir.join("labels-client.yaml");
    let client_s = client.to_string_lossy().into_owned();
    let exporter_s = dir
        .join("labels-exporter.yaml")
        .to_string_lossy()
        .into_owned();
    our_admin(
        env,
        &[
            "create",
            "client",
            "labels-client",
            "--unsafe",
            "--nointeractive",
            "--out",
            &client_s,
        ],
    )?;
    our_admin(
        env,
        &[
            "create",
            "exporter",
            "labels-exporter",
            "-l",
            "board=interop",
            "-l",
            "old-board=interop",
            "-l",
            "example.com/rack=r7",
            "-l",
            "hidden.jumpstarter.dev/owner=ci-pool",
            "--nointeractive",
            "--out",
            &exporter_s,
        ],
    )?;
    let out = py_jmp(env, &client, &["get", "exporters"], &["-o", "yaml"])?;
    check(&out, "(python) jmp get exporters -o yaml")?;
    ensure!(
        out.stdout.contains("labels-exporter") && out.stdout.contains("interop"),
        "exporter not listed:\n{}",
        out.stdout
    );
    // The deprecated label is left out of the labels and reported with its message (0.9.0
    // knows `deprecated_labels` already).
    ensure!(
        out.stdout.contains("old-board: use board instead"),
        "old-board not reported as deprecated:\n{}",
        out.stdout
    );
    for hidden in ["ci-pool", "r7", "old-board: interop"] {
        ensure!(
            !out.stdout.contains(hidden),
            "{hidden} shown without --show-hidden-labels:\n{}",
            out.stdout
        );
    }
    let out = py_jmp(
        env,
        &client,
        &["get", "exporters"],
        &["--show-hidden-labels", "-o", "yaml"],
    )?;
    check(&out, "(python) jmp get exporters --show-hidden-labels")?;
    for shown in [
        "hidden.jumpstarter.dev/owner",
        "ci-pool",
        "r7",
        "old-board: interop",
    ] {
        ensure!(
            out.stdout.contains(shown),
            "{shown} not shown with --show-hidden-labels:\n{}",
            out.stdout
        );
    }
    let lease = py_create_lease(env, &client, "old-board=interop")?;
    let out = py_jmp(env, &client, &["get", "leases"], &["-o", "yaml"])?;
    check(&out, "(python) jmp get leases")?;
    ensure!(
        out.stdout.contains(&lease),
        "lease {lease} not listed:\n{}",
        out.stdout
    );
    let out = py_jmp(env, &client, &["delete", "leases"], &[&lease])?;
    check(&out, "(python) jmp delete leases")
}
