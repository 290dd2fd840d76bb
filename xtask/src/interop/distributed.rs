//! Distributed mode across implementations, through our controller and its in-process
//! router: the upstream exporter (`jmp run` in controller mode) driven by our client, and our
//! exporter driven by the upstream client. Each drives MockPower and round-trips 64 MiB
//! through MockStorageMux, so the whole session (gRPC over the router tunnel, resource
//! streams included) crosses the router. Our exporter also offers the direct path, which the
//! upstream client ignores.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context, Result, ensure};

use super::{
    CALL_TIMEOUT, Env, STORAGE_BYTES, STORAGE_TIMEOUT, check, path_with_venv, storage_random_file,
    storage_same_files,
};
use crate::procs::{self, Background};

/// The drivers both exporters serve (upstream class paths; ours maps them to its drivers).
const EXPORT: &str = "export:
  power:
    type: jumpstarter_driver_power.driver.MockPower
  storage:
    type: jumpstarter_driver_opendal.driver.MockStorageMux
";

/// Our controller (fresh data in `data`), its admin config where our `jmp admin` looks.
/// `jmp admin create client|exporter NAME ARGS... --out FILE` with our `jmp`.
fn admin_create(env: &Env, kind: &str, name: &str, args: &[&str]) -> Result<PathBuf> {
    let out = env.work.path().join(format!("{name}.{kind}.yaml"));
    let mut c = env.ours(&env.jmp);
    c.env_remove("JMP_ADMIN_CONFIG")
        .args(["admin", "create", kind, name, "--nointeractive", "--out"])
        .arg(&out)
        .args(args);
    check(
        &procs::run(c, CALL_TIMEOUT)?,
        &format!("jmp admin create {kind} {name}"),
    )?;
    Ok(out)
}

/// An exporter object labelled `board=<board>` and its config, serving [`EXPORT`].
fn exporter_config(env: &Env, name: &str, board: &str) -> Result<PathBuf> {
    exporter_config_with(env, name, board, EXPORT)
}

/// An exporter object labelled `board=<board>` and its config, serving `export` (an
/// `export:` mapping).
pub(super) fn exporter_config_with(
    env: &Env,
    name: &str,
    board: &str,
    export: &str,
) -> Result<PathBuf> {
    let path = admin_create(env, "exporter", name, &["-l", &format!("board={board}")])?;
    let text = std::fs::read_to_string(&path)?;
    ensure!(
        text.contains("\nexport:\n"),
        "{} has no empty `export:` to fill:\n{text}",
        path.display()
    );
    std::fs::write(&path, text.replace("\nexport:\n", &format!("\n{export}")))?;
    Ok(path)
}

/// A client object allowed every driver, and its config.
pub(super) fn client_config(env: &Env, name: &str) -> Result<PathBuf> {
    admin_create(env, "client", name, &["--unsafe"])
}

/// `PATH` with our binaries first (so `j` in our shell is ours).
fn path_with_ours(env: &Env) -> Result<String> {
    Ok(format!(
        "{}:{}",
        env.jmp.parent().context("no binary directory")?.display(),
        std::env::var("PATH").unwrap_or_default()
    ))
}

/// Our `jmp shell --client-config CLIENT -l board=BOARD -- sh -c SCRIPT`.
pub(super) fn our_shell(
    env: &Env,
    client: &Path,
    board: &str,
    script: &str,
) -> Result<procs::Output> {
    let mut c = env.ours(&env.jmp);
    c.env("PATH", path_with_ours(env)?)
        .arg("shell")
        .arg("--client-config")
        .arg(client)
        .args(["-l", &format!("board={board}"), "--", "sh", "-c", script]);
    procs::run(c, STORAGE_TIMEOUT)
}

/// Each `j` in our shell ended its tunnel cleanly: the shell reported none lost.
pub(super) fn no_tunnel_lost(out: &procs::Output) -> Result<()> {
    ensure!(
        !out.stderr.contains("Lost the connection"),
        "jmp shell reported a tunnel lost:\n{}",
        out.stderr
    );
    Ok(())
}

/// Upstream `jmp shell --client-config CLIENT -l board=BOARD -- COMMAND...`.
pub(super) fn py_shell(
    env: &Env,
    client: &Path,
    board: &str,
    command: &[&Path],
) -> Result<procs::Output> {
    let mut c = env.upstream("jmp");
    c.env("PATH", path_with_venv(env))
        .arg("shell")
        .arg("--client-config")
        .arg(client)
        .args(["-l", &format!("board={board}"), "--"])
        .args(command);
    procs::run(c, STORAGE_TIMEOUT)
}

fn quoted(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', "'\\''"))
}

/// The upstream exporter in controller mode, driven by our `jmp shell` and `j`.
pub(super) fn our_client_to_py_exporter(env: &Env) -> Result<()> {
    let _controller = super::controller::start_controller(env, "dist-py-exporter-data")?.0;
    let exporter = exporter_config(env, "py-exporter", "py")?;
    let client = client_config(env, "rs-client")?;

    let mut c = env.upstream("jmp");
    c.arg("run").arg("--exporter-config").arg(&exporter);
    let mut py_exporter = Background::start("(python) jmp run", c)?;
    py_exporter.wait_for_line("Currently not leased", Duration::from_secs(60))?;

    let out = our_shell(env, &client, "py", "j power on && j power read")?;
    check(&out, "jmp shell -l board=py -- j power on && j power read")?;
    no_tunnel_lost(&out)?;
    super::expect_readings(&out)?;
    py_exporter.wait_for_line("power on", Duration::from_secs(30))?;

    let src = env.work.path().join("dist-rs-src.img");
    let dst = env.work.path().join("dist-rs-dst.img");
    storage_random_file(&src, STORAGE_BYTES, 0xd157)?;
    let script = format!(
        "j storage write-local-file {} && j storage read-local-file {}",
        quoted(&src),
        quoted(&dst)
    );
    let out = our_shell(env, &client, "py", &script)?;
    check(
        &out,
        "jmp shell -l board=py -- j storage write/read-local-file",
    )?;
    no_tunnel_lost(&out)?;
    storage_same_files(&src, &dst)
}

/// Our exporter in controller mode, driven by the upstream `jmp shell` and `j` (and the
/// upstream storage client: `j storage` has no read command upstream, so a script).
pub(super) fn py_client_to_our_exporter(env: &Env) -> Result<()> {
    let _controller = super::controller::start_controller(env, "dist-rs-exporter-data")?.0;
    let exporter = exporter_config(env, "rs-exporter", "rs")?;
    let client = client_config(env, "py-client")?;

    // With the direct path on: the upstream client ignores the endpoints our exporter
    // advertises and keeps working through the router.
    let mut c = env.ours(&env.jmp);
    c.arg("run")
        .arg("--exporter-config")
        .arg(&exporter)
        .args(["--direct-listener", "127.0.0.1:0"]);
    let mut our_exporter = Background::start("jmp run", c)?;
    our_exporter.wait_for_line("direct listener on 127.0.0.1:", Duration::from_secs(60))?;
    our_exporter.wait_for_line("registered with controller", Duration::from_secs(60))?;

    let j = env.venv.join("bin").join("j");
    let out = py_shell(
        env,
        &client,
        "rs",
        &[&j, Path::new("power"), Path::new("on")],
    )?;
    check(&out, "(python) jmp shell -l board=rs -- j power on")?;
    let out = py_shell(
        env,
        &client,
        "rs",
        &[&j, Path::new("power"), Path::new("read")],
    )?;
    check(&out, "(python) jmp shell -l board=rs -- j power read")?;
    super::expect_readings(&out)?;

    let src = env.work.path().join("dist-py-src.img");
    let dst = env.work.path().join("dist-py-dst.img");
    storage_random_file(&src, STORAGE_BYTES, 0xd158)?;
    let python = env.venv.join("bin").join("python");
    let script = env.scripts.join("storage_roundtrip.py");
    let out = py_shell(env, &client, "rs", &[&python, &script, &src, &dst])?;
    check(
        &out,
        "(python) jmp shell -l board=rs -- python storage_roundtrip.py",
    )?;
    ensure!(
        out.stdout.contains("python storage round trip ok"),
        "{}",
        out.stdout
    );
    storage_same_files(&src, &dst)
}

/// The hooks both exporters get in the hook cases: output lines whose order the clients must
/// keep.
const HOOKS: &str = "hooks:
  beforeLease:
    script: |
      echo interop-hook before one
      echo interop-hook before two
    timeout: 60
    onFailure: endLease
  afterLease:
    script: |
      echo interop-hook after one
    timeout: 60
";

/// The hook lines, in the order they must appear.
const HOOK_LINES: [&str; 3] = [
    "interop-hook before one",
    "interop-hook before two",
    "interop-hook after one",
];

/// An exporter config as [`exporter_config`] writes it, with [`HOOKS`].
fn exporter_config_with_hooks(env: &Env, name: &str, board: &str) -> Result<PathBuf> {
    let path = exporter_config(env, name, board)?;
    replace_hooks(&path, HOOKS)?;
    Ok(path)
}

/// Replaces the `hooks:` section of the exporter config at `path` with `hooks`.
fn replace_hooks(path: &Path, hooks: &str) -> Result<()> {
    // Our `jmp admin create` writes an empty `hooks:` section: replace it.
    let mut text = String::new();
    let mut in_hooks = false;
    for line in std::fs::read_to_string(path)?.lines() {
        if line.starts_with("hooks:") {
            in_hooks = true;
            continue;
        }
        if in_hooks && (line.is_empty() || line.starts_with(' ')) {
            continue;
        }
        in_hooks = false;
        text.push_str(line);
        text.push('\n');
    }
    std::fs::write(path, format!("{text}{hooks}"))?;
    Ok(())
}

/// Every hook line appears in one of the client's output streams, in order.
fn hook_output_in_order(out: &procs::Output, what: &str) -> Result<()> {
    let in_order = |text: &str| {
        let mut from = 0;
        HOOK_LINES.iter().all(|line| match text[from..].find(line) {
            Some(i) => {
                from += i + line.len();
                true
            }
            None => false,
        })
    };
    ensure!(
        in_order(&out.stderr) || in_order(&out.stdout),
        "{what}: the hook output is missing or out of order (want {HOOK_LINES:?})\nstdout:\n{}\nstderr:\n{}",
        out.stdout,
        out.stderr
    );
    Ok(())
}

/// The upstream exporter with hooks, driven by our `jmp shell`: the beforeLease output
/// before the command, the afterLease output before the shell returns.
pub(super) fn our_client_to_py_exporter_with_hooks(env: &Env) -> Result<()> {
    let _controller = super::controller::start_controller(env, "hooks-py-exporter-data")?.0;
    let exporter = exporter_config_with_hooks(env, "py-hooks-exporter", "pyhooks")?;
    let client = client_config(env, "rs-hooks-client")?;
    let mut c = env.upstream("jmp");
    c.arg("run").arg("--exporter-config").arg(&exporter);
    let mut py_exporter = Background::start("(python) jmp run", c)?;
    py_exporter.wait_for_line("Currently not leased", Duration::from_secs(60))?;
    let out = our_shell(env, &client, "pyhooks", "j power on")?;
    check(&out, "jmp shell -l board=pyhooks -- j power on")?;
    hook_output_in_order(&out, "jmp shell -l board=pyhooks")
}

/// Our exporter with hooks, driven by the upstream `jmp shell`.
pub(super) fn py_client_to_our_exporter_with_hooks(env: &Env) -> Result<()> {
    let _controller = super::controller::start_controller(env, "hooks-rs-exporter-data")?.0;
    let exporter = exporter_config_with_hooks(env, "rs-hooks-exporter", "rshooks")?;
    let client = client_config(env, "py-hooks-client")?;
    let mut c = env.ours(&env.jmp);
    c.arg("run").arg("--exporter-config").arg(&exporter);
    let mut our_exporter = Background::start("jmp run", c)?;
    our_exporter.wait_for_line("registered with controller", Duration::from_secs(60))?;
    let j = env.venv.join("bin").join("j");
    let out = py_shell(
        env,
        &client,
        "rshooks",
        &[&j, Path::new("power"), Path::new("on")],
    )?;
    check(&out, "(python) jmp shell -l board=rshooks -- j power on")?;
    hook_output_in_order(&out, "(python) jmp shell -l board=rshooks")
}

/// Upstream's Python client holds one connection to our exporter over a lease that ends
/// while the afterLease hook runs: its calls after the end are refused; the hook's own `j`
/// keeps working.
pub(super) fn py_raw_client_is_refused_after_the_lease_ended(env: &Env) -> Result<()> {
    let _controller = super::controller::start_controller(env, "lease-end-raw-data")?.0;
    let exporter = exporter_config(env, "rs-lease-end-exporter", "rsleaseend")?;
    let client = client_config(env, "py-lease-end-client")?;
    let (started, done) = (
        env.work.path().join("lease-end-hook-started"),
        env.work.path().join("lease-end-hook-done"),
    );
    let hooks = format!(
        "hooks:\n  afterLease:\n    script: |\n      j power on\n      touch {started}\n      \
         sleep 3\n      j power off\n      touch {done}\n    timeout: 60\n",
        started = quoted(&started),
        done = quoted(&done)
    );
    replace_hooks(&exporter, &hooks)?;
    let mut c = env.ours(&env.jmp);
    c.arg("run").arg("--exporter-config").arg(&exporter);
    let mut our_exporter = Background::start("jmp run", c)?;
    our_exporter.wait_for_line("registered with controller", Duration::from_secs(60))?;
    let mut c = env.upstream("python");
    c.env("PATH", path_with_venv(env))
        .arg(env.scripts.join("lease_end_raw_client.py"))
        .arg(&client)
        .arg("board=rsleaseend")
        .arg(&started);
    let out = procs::run(c, STORAGE_TIMEOUT)?;
    check(&out, "(python) lease_end_raw_client.py")?;
    ensure!(
        out.stdout
            .contains("driver call after the lease ended: refused:")
            && out.stdout.contains("has ended"),
        "stdout:\n{}\nstderr:\n{}",
        out.stdout,
        out.stderr
    );
    for _ in 0..300 {
        if done.exists() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    anyhow::bail!("the afterLease hook's own j did not work after the client was refused")
}

/// Upstream's exporter started as a second process of an exporter identity our exporter
/// holds online: it is refused with the reason at once, and stopping it takes nothing
/// offline (our exporter keeps serving leases).
pub(super) fn py_second_exporter_process_is_refused(env: &Env) -> Result<()> {
    let _controller = super::controller::start_controller(env, "twin-data")?.0;
    let exporter = exporter_config(env, "twin-exporter", "twin")?;
    let client = client_config(env, "twin-client")?;
    let mut c = env.ours(&env.jmp);
    c.arg("run").arg("--exporter-config").arg(&exporter);
    let mut ours = Background::start("jmp run", c)?;
    ours.wait_for_line("registered with controller", Duration::from_secs(60))?;

    let mut c = env.upstream("jmp");
    c.arg("run").arg("--exporter-config").arg(&exporter);
    let mut py = Background::start("(python) jmp run, a second process", c)?;
    let line = py.wait_for_line("is already online", Duration::from_secs(60))?;
    ensure!(
        line.contains("exporter default/twin-exporter is already online (connected from "),
        "{line}"
    );
    py.stop();
    let out = our_shell(env, &client, "twin", "j power on")?;
    check(
        &out,
        "jmp shell -l board=twin -- j power on, after the second process stopped",
    )?;
    no_tunnel_lost(&out)
}
