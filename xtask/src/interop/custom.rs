//! A lab's own Rust driver under upstream's Python client: the example crate's `my-jmp`
//! (`examples/custom-driver`, the stock `jmp` with its `Chamber` driver added) in controller
//! mode through our controller and router, driven by upstream's `jmp shell`, its Python
//! client (through the client class the example ships) and its `j` (the class's `cli()`).

use std::{path::Path, process::Command, time::Duration};

use anyhow::{Context, Result, ensure};

use super::{CALL_TIMEOUT, Env, check, path_with_venv};
use crate::procs::{self, Background};

/// The chamber beside a stock driver.
const EXPORT: &str = "export:
  chamber:
    type: jumpstarter_example_chamber.driver.Chamber
    config:
      label: interop-chamber
      sensors: 3
      setpoint: 20
      min: -10
      max: 60
  power:
    type: jumpstarter_driver_power.driver.MockPower
";

/// Upstream `jmp shell --client-config CLIENT -l board=custom -- COMMAND...`, with the
/// example's Python client class importable.
fn py_shell(env: &Env, client: &Path, command: &[&std::ffi::OsStr]) -> Result<procs::Output> {
    let python = crate::workspace_root().join("examples/custom-driver/python");
    let mut c = env.upstream("jmp");
    c.env("PATH", path_with_venv(env))
        .env("PYTHONPATH", python)
        .arg("shell")
        .arg("--client-config")
        .arg(client)
        .args(["-l", "board=custom", "--"])
        .args(command);
    procs::run(c, CALL_TIMEOUT)
}

/// The scenario.
pub(super) fn py_client_to_custom_driver(env: &Env) -> Result<()> {
    crate::debug_build()?;
    let my_jmp = env
        .jmp
        .parent()
        .context("no binary directory")?
        .join("my-jmp");
    let _controller = super::controller::start_controller(env, "custom-driver-data")?.0;
    let exporter = super::distributed::exporter_config_with(env, "custom-ex", "custom", EXPORT)?;
    let client = super::distributed::client_config(env, "custom-py-client")?;

    let mut c: Command = env.ours(&my_jmp);
    c.arg("run").arg("--exporter-config").arg(&exporter);
    let mut ours = Background::start("my-jmp run", c)?;
    ours.wait_for_line("registered with controller", Duration::from_secs(60))?;

    let python = env.venv.join("bin").join("python");
    let script = env.scripts.join("chamber_client.py");
    let out = py_shell(env, &client, &[python.as_os_str(), script.as_os_str()])?;
    check(&out, "(python) jmp shell -- python chamber_client.py")?;
    ensure!(
        out.stdout.contains("python chamber client ok"),
        "{}",
        out.stdout
    );

    // Upstream's `j` builds its commands from the class's `cli()`.
    let j = env.venv.join("bin").join("j");
    let out = py_shell(
        env,
        &client,
        &[
            j.as_os_str(),
            "chamber".as_ref(),
            "ask".as_ref(),
            "TARGET?".as_ref(),
        ],
    )?;
    check(&out, "(python) jmp shell -- j chamber ask TARGET?")?;
    ensure!(out.stdout.contains("TARGET 21"), "{}", out.stdout);
    let out = py_shell(
        env,
        &client,
        &[
            j.as_os_str(),
            "chamber".as_ref(),
            "read".as_ref(),
            "-n".as_ref(),
            "1".as_ref(),
        ],
    )?;
    check(&out, "(python) jmp shell -- j chamber read -n 1")?;
    ensure!(
        out.stdout.contains("sensor=2 celsius=23.0"),
        "{}",
        out.stdout
    );
    ours.wait_for_line("target 20 -> 33.5 °C", Duration::from_secs(30))?;
    Ok(())
}
