//! Upstream Python tools against our controller (`jumpstarter-controller`, embedded store,
//! in-process router): `jmp run` in controller mode registers and is shown online, and the
//! Python client lists exporters, creates, lists and deletes leases, and runs `j` in
//! `jmp shell` through our router; a lease another client shares with it, it lists and releases. Objects and configs come from our `jmp admin`, which finds
//! the controller through the admin config the controller writes on start.

use std::{path::Path, process::Command, time::Duration};

use anyhow::{Context, Result, ensure};

use super::{CALL_TIMEOUT, Env, check, path_with_venv};
use crate::procs::{self, Background};

/// What the controller prints once it serves (see `jumpstarter_controller::cli`).
const READY_LINE: &str = "jumpstarter-controller ready:";

/// Our controller on loopback ports chosen by the OS; its admin config goes where our `jmp`
/// (with this run's config home) looks by default.
/// Starts our controller (data in `work/DATA`, admin config in `work/rs-config`); returns it
/// with its advertised endpoint.
pub(super) fn start_controller(env: &Env, data: &str) -> Result<(Background, String)> {
    start_controller_with(env, data, &[])
}

/// As [`start_controller`], with `extra` arguments (`--config FILE`, say).
pub(super) fn start_controller_with(
    env: &Env,
    data: &str,
    extra: &[&str],
) -> Result<(Background, String)> {
    crate::debug_build()?;
    let bin = env
        .jmp
        .parent()
        .context("no binary directory")?
        .join("jumpstarter-controller");
    let mut c = Command::new(bin);
    if let super::ControllerStore::Kubernetes {
        kubeconfig,
        namespace,
    } = &env.store
    {
        c.args(["--store", "kubernetes", "--namespace", namespace])
            .env("KUBECONFIG", kubeconfig);
    }
    c.arg("--data-dir")
        .arg(env.work.path().join(data))
        .args(["--listen", "127.0.0.1:0", "--router-listen", "127.0.0.1:0"])
        .args(["--metrics-listen", "off"])
        .arg("--admin-config")
        .arg(env.work.path().join("rs-config").join("admin.yaml"))
        .args(extra)
        .env("RUST_LOG", "info");
    let mut ctl = Background::start("jumpstarter-controller", c)?;
    let line = ctl.wait_for_line(READY_LINE, Duration::from_secs(60))?;
    let endpoint = line
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("endpoint="))
        .with_context(|| format!("no endpoint in {line:?}"))?
        .to_string();
    Ok((ctl, endpoint))
}

pub(super) fn our_admin(env: &Env, args: &[&str]) -> Result<()> {
    let mut c = env.ours(&env.jmp);
    c.env_remove("JMP_ADMIN_CONFIG").arg("admin").args(args);
    let out = procs::run(c, CALL_TIMEOUT)?;
    check(&out, &format!("jmp admin {}", args.join(" ")))
}

/// Upstream `jmp COMMAND... --client-config CLIENT ARGS...`.
pub(super) fn py_jmp(
    env: &Env,
    client: &Path,
    command: &[&str],
    args: &[&str],
) -> Result<procs::Output> {
    let mut c = env.upstream("jmp");
    c.env("PATH", path_with_venv(env))
        .args(command)
        .arg("--client-config")
        .arg(client)
        .args(args);
    procs::run(c, CALL_TIMEOUT)
}

/// Upstream `jmp create lease -l SELECTOR --duration 10m -o name`; the lease's name.
pub(super) fn py_create_lease(env: &Env, client: &Path, selector: &str) -> Result<String> {
    let out = py_jmp(
        env,
        client,
        &["create", "lease"],
        &["-l", selector, "--duration", "10m", "-o", "name"],
    )?;
    check(&out, &format!("(python) jmp create lease -l {selector}"))?;
    let lease = out
        .stdout
        .trim()
        .rsplit('/')
        .next()
        .unwrap_or("")
        .to_string();
    ensure!(!lease.is_empty(), "no lease name printed: {:?}", out.stdout);
    Ok(lease)
}

/// The scenario.
pub(super) fn py_tools_against_our_controller(env: &Env) -> Result<()> {
    let (_controller, endpoint) = start_controller(env, "controller-data")?;
    let dir = env.work.path();
    let client = dir.join("py-client.yaml");
    let exporter = dir.join("py-exporter.yaml");
    let client_s = client.to_string_lossy().into_owned();
    let exporter_s = exporter.to_string_lossy().into_owned();
    our_admin(
        env,
        &[
            "create",
            "client",
            "py-client",
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
            "py-exporter",
            "-l",
            "board=interop",
            "--nointeractive",
            "--out",
            &exporter_s,
        ],
    )?;
    let text = std::fs::read_to_string(&client)?;
    ensure!(
        text.contains(&endpoint),
        "the client config does not name the controller endpoint {endpoint}:\n{text}"
    );
    let mut c = env.upstream("python");
    c.arg(env.scripts.join("set_export.py")).arg(&exporter);
    check(&procs::run(c, CALL_TIMEOUT)?, "set_export.py")?;

    // The upstream exporter in controller mode: Register, ReportStatus, Status stream.
    let mut c = env.upstream("jmp");
    c.arg("run").arg("--exporter-config").arg(&exporter);
    let mut py_exporter = Background::start("(python) jmp run", c)?;
    py_exporter.wait_for_line("Currently not leased", Duration::from_secs(60))?;

    // Shown online (the reconcile loop writes the Online condition; give it a moment).
    let mut online = false;
    let mut last = String::new();
    for _ in 0..30 {
        let out = py_jmp(
            env,
            &client,
            &["get", "exporters"],
            &["--with", "online,status"],
        )?;
        check(&out, "(python) jmp get exporters")?;
        online = out.stdout.lines().any(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols.first() == Some(&"py-exporter") && cols.get(1) == Some(&"yes")
        });
        last = out.stdout;
        if online {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    ensure!(online, "py-exporter not shown online:\n{last}");

    // Create a lease; the exporter is told it is leased.
    let lease = py_create_lease(env, &client, "board=interop")?;
    py_exporter.wait_for_line(
        &format!("Currently leased by py-client under {lease}"),
        Duration::from_secs(30),
    )?;
    let out = py_jmp(env, &client, &["get", "leases"], &["-o", "name"])?;
    check(&out, "(python) jmp get leases")?;
    ensure!(
        out.stdout.contains(&lease),
        "lease {lease} not listed:\n{}",
        out.stdout
    );

    // A driver call through our router: Dial, Listen, two Stream halves paired.
    let out = py_jmp(
        env,
        &client,
        &["shell"],
        &["--lease", &lease, "--", "j", "power", "on"],
    )?;
    check(&out, "(python) jmp shell --lease ... -- j power on")?;
    py_exporter.wait_for_line("power on", Duration::from_secs(30))?;

    // Delete it: gone from the active list, the exporter is free again.
    let out = py_jmp(env, &client, &["delete", "leases"], &[&lease])?;
    check(&out, "(python) jmp delete leases")?;
    py_exporter.wait_for_line("Currently not leased", Duration::from_secs(30))?;
    let out = py_jmp(env, &client, &["get", "leases"], &["-o", "name"])?;
    check(&out, "(python) jmp get leases after delete")?;
    ensure!(
        !out.stdout.contains(&lease),
        "lease {lease} still listed as active:\n{}",
        out.stdout
    );

    // A lease our jmp's client shares with py-client (`spec.sharedWith`, a field upstream's
    // 0.9.0 client does not know): the Python client lists it (`-A`) and releases it.
    let owner = dir.join("rs-owner.yaml");
    let owner_s = owner.to_string_lossy().into_owned();
    our_admin(
        env,
        &[
            "create",
            "client",
            "rs-owner",
            "--unsafe",
            "--nointeractive",
            "--out",
            &owner_s,
        ],
    )?;
    let mut c = env.ours(&env.jmp);
    c.args([
        "create",
        "lease",
        "-l",
        "board=interop",
        "--duration",
        "10m",
    ])
    .args(["--share", "py-client", "-o", "name", "--client-config"])
    .arg(&owner);
    let out = procs::run(c, CALL_TIMEOUT)?;
    check(&out, "jmp create lease --share py-client")?;
    let shared = out.stdout.trim().to_string();
    ensure!(
        !shared.is_empty(),
        "no lease name printed: {:?}",
        out.stdout
    );
    py_exporter.wait_for_line(
        &format!("Currently leased by rs-owner under {shared}"),
        Duration::from_secs(30),
    )?;
    // Upstream's `jmp get leases` shows only the leases a client owns unless `-A`.
    let out = py_jmp(env, &client, &["get", "leases"], &["-A", "-o", "name"])?;
    check(&out, "(python) jmp get leases -A (shared)")?;
    ensure!(
        out.stdout.contains(&shared),
        "the shared lease {shared} is not listed:\n{}",
        out.stdout
    );
    // (Upstream's 0.9.0 `jmp shell --lease` itself refuses a lease whose owner is another
    // client, before asking the controller; our `jmp shell` uses it.)
    let out = py_jmp(env, &client, &["delete", "leases"], &[&shared])?;
    check(&out, "(python) jmp delete leases SHARED")?;
    py_exporter.wait_for_line("Currently not leased", Duration::from_secs(30))?;
    Ok(())
}
