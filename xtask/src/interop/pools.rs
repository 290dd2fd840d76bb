//! Upstream's 0.9.0 client against a virtual target pool of our controller: an ExporterSet
//! (class `provisioner: local`, a MockPower template, no replica until one is asked for)
//! applied with our `jmp admin apply`; upstream's `jmp shell -l pool=interop` leases by the
//! template's label, the controller starts a replica for the waiting lease, and `j power
//! on/off` runs through our router on it. The exporter that served is a replica of the set
//! (its name, its directory and log under the controller's `pools/`).

use std::{path::Path, time::Duration};

use anyhow::{Context, Result, ensure};

use super::{Env, check, path_with_venv};
use crate::procs;

use super::controller::{our_admin, start_controller_with};

/// The set's name: its replicas are `interop-pool-XXXXX`.
const SET: &str = "interop-pool";

/// The class and the set: nothing runs until a lease waits (`minAvailableReplicas: 0`); a
/// replica serves leases in turn (`InPlaceReuse`) so its log outlives the lease.
const POOL: &str = "apiVersion: virtualtarget.jumpstarter.dev/v1alpha1
kind: VirtualTargetClass
metadata: {name: local, namespace: default}
spec:
  provisioner: local
---
apiVersion: virtualtarget.jumpstarter.dev/v1alpha1
kind: ExporterSet
metadata: {name: interop-pool, namespace: default}
spec:
  virtualTargetClassName: local
  maxReplicas: 1
  minAvailableReplicas: 0
  scaleDownCooldown: 2s
  recycleStrategy: InPlaceReuse
  selector:
    matchLabels: {pool: interop}
  template:
    metadata:
      labels: {pool: interop}
    spec:
      drivers:
        - name: power
          type: jumpstarter_driver_power.driver.MockPower
";

/// Upstream's `jmp shell -l pool=interop -- sh -c SCRIPT`; its stdout.
fn py_shell(env: &Env, client: &Path, script: &str) -> Result<String> {
    let mut c = env.upstream("jmp");
    c.env("PATH", path_with_venv(env))
        .args(["shell", "--client-config"])
        .arg(client)
        .args(["-l", "pool=interop", "--", "sh", "-c", script]);
    // The first lease waits for a replica to start: longer than a plain call.
    let out = procs::run(c, Duration::from_secs(180))?;
    check(
        &out,
        &format!("(python) jmp shell -l pool=interop -- {script}"),
    )?;
    Ok(out.stdout)
}

/// The scenario.
pub(super) fn py_client_leases_a_pool_replica(env: &Env) -> Result<()> {
    let data = "pools-data";
    let (_controller, _endpoint) = start_controller_with(
        env,
        data,
        &[
            "--pools-stop-replicas-on-exit",
            "--pools-replicas-exit-with-controller",
        ],
    )?;
    let dir = env.work.path();
    let client = dir.join("py-pool-client.yaml");
    let client_s = client.to_string_lossy().into_owned();
    our_admin(
        env,
        &[
            "create",
            "client",
            "py-pool-client",
            "--unsafe",
            "--nointeractive",
            "--out",
            &client_s,
        ],
    )?;
    let pool = dir.join("pool.yaml");
    std::fs::write(&pool, POOL)?;
    our_admin(env, &["apply", "-f", &pool.to_string_lossy()])?;

    // Upstream's shell sets JMP_EXPORTER to the exporter that serves its lease.
    let out = py_shell(
        env,
        &client,
        "j power on && j power off && echo \"exporter=$JMP_EXPORTER\"",
    )?;
    let exporter = out
        .split("exporter=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .with_context(|| format!("no exporter printed:\n{out}"))?
        .to_string();
    ensure!(
        exporter.starts_with(&format!("{SET}-")),
        "the lease on pool=interop was served by {exporter:?}, not a replica of {SET}"
    );
    let log = dir
        .join(data)
        .join("pools/default")
        .join(&exporter)
        .join("exporter.log");
    let text = std::fs::read_to_string(&log)
        .with_context(|| format!("replica {exporter}'s log {}", log.display()))?;
    for call in ["power on", "power off"] {
        ensure!(
            text.contains(&format!("[driver.MockPower] {call}")),
            "replica {exporter} did not log {call:?}:\n{text}"
        );
    }

    // The replica is reused for the next lease (maxReplicas 1).
    let out = py_shell(
        env,
        &client,
        "j power on && echo \"exporter=$JMP_EXPORTER\"",
    )?;
    ensure!(
        out.contains(&format!("exporter={exporter}")),
        "the second lease was not served by the pool's one replica {exporter}:\n{out}"
    );
    Ok(())
}
