//! `cargo xtask kube-e2e`: the Kubernetes backend against a real API server.
//!
//! Starts a cluster with [`crate::kube::up`] (stopped again at the end, also on failure), or
//! with `--reuse` runs against the one `cargo xtask kube-up` left running (as it is, with what
//! earlier runs left in it: every test makes its own objects and namespaces), then:
//! 1. the Store contract suite (`store::tests::real_kube_backend`, the generic tests that
//!    also run against SQLite and the fake API server) as the cluster's admin;
//! 2. the controller's real-server tests (`tests/it/real_kube.rs`, and
//!    `tests/it/real_kube_storm.rs`: two controllers, the leader killed with SIGKILL during a
//!    lease storm) as the controller's ServiceAccount, bound to the ClusterRole of
//!    `deploy/kubernetes/base/rbac.yaml`;
//! 3. the quickstart walkthrough (admin create, `jmp run`, `jmp get`, `jmp shell` with
//!    `j power on`) with `jumpstarter-controller --store kubernetes` as that ServiceAccount;
//! 4. clients authenticated with ServiceAccount tokens through the external-issuer path
//!    ([`crate::kube_oidc`]);
//! 5. upstream's Python exporter and client (pinned 0.9.0 venv) through that controller, and
//!    our `jmp shell` against the Python exporter;
//! 6. with `--images DIR` (as `cargo xtask ci` runs it), the image archives of DIR run by
//!    podman: the controller image against this API server, the router image from the
//!    Secrets it wrote, `jmp` from the jmp image through them ([`crate::images_run`]);
//! 7. `deploy/kubernetes/base` under kube-controller-manager's Deployment and ReplicaSet
//!    controllers with a stand-in node: `kubectl rollout status`, a rolling restart, the
//!    leader killed under load ([`crate::kube_rollout`]);
//! 8. a virtual target pool with the `qemu.jumpstarter.dev` provisioner: its replicas as Pods
//!    on the stand-in node, leases served by them, scaling, and garbage collection of the
//!    Pods when the ExporterSet goes ([`crate::kube_pools`]);
//! 9. upstream's 0.9.0 Go controller and router with upstream's CRDs, driven by our exporter,
//!    `jmp` and `j` ([`crate::go_controller`]).

use anyhow::{Result, bail};

use crate::kube;

/// Runs the suite (`--reuse`: on the running cluster; `--images DIR`: also the image
/// archives of DIR under podman, [`crate::images_run`]).
pub fn run(args: &[String]) -> Result<()> {
    let (mut reuse, mut images) = (false, None);
    let mut rest = args.iter();
    while let Some(a) = rest.next() {
        match (a.as_str(), rest.as_slice().first()) {
            ("--reuse", _) => reuse = true,
            ("--images", Some(dir)) => {
                images = Some(std::path::PathBuf::from(dir));
                rest.next();
            }
            _ => bail!("usage: cargo xtask kube-e2e [--reuse] [--images DIR]"),
        }
    }
    let cluster = if reuse {
        kube::running()?;
        None
    } else {
        Some(kube::up()?)
    };
    println!("== deploy/kubernetes applied, its RBAC as the controller's ServiceAccount");
    crate::manifests::against_cluster()?;
    let admin = kube::admin_kubeconfig().display().to_string();
    let controller = kube::controller_kubeconfig().display().to_string();
    // The real-server tests are `#[ignore]`d in `cargo test --workspace`; these run them,
    // with the build and the feature set every other suite shares (nothing is rebuilt).
    let test = |target: &[&str], filter: &str| -> Vec<String> {
        ["test", "--workspace", "--features", crate::TEST_FEATURES]
            .iter()
            .chain(target)
            .chain(&["--", "--ignored", filter])
            .map(|s| s.to_string())
            .collect()
    };
    println!(
        "== the Store contract suite against kube-apiserver {}",
        kube::K8S_VERSION
    );
    let args = test(&["--lib"], "store::tests::real_kube_backend::");
    crate::cargo_with_env(
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        &[("KUBECONFIG", &admin)],
    )?;
    println!("== the controller's real-server tests (as its ServiceAccount)");
    let args = test(&["--test", "it"], "real_kube");
    crate::cargo_with_env(
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        &[
            ("KUBECONFIG", &admin),
            ("JMP_TEST_CONTROLLER_KUBECONFIG", &controller),
        ],
    )?;
    println!("== the quickstart with jumpstarter-controller --store kubernetes");
    forget_last_walkthrough()?;
    crate::quickstart::walkthrough(
        &crate::debug_build()?,
        &crate::target_dir().join("kube-e2e-lab"),
        &["--store", "kubernetes", "--namespace", kube::NAMESPACE],
        &[("KUBECONFIG", &controller)],
    )?;
    println!("== clients with ServiceAccount tokens, the API server as OIDC issuer");
    crate::kube_oidc::run()?;
    println!(
        "== upstream's Python exporter and client with jumpstarter-controller --store kubernetes"
    );
    let (exporters, clients) = crate::interop::KUBE_SCENARIO_OBJECTS;
    crate::interop::against_kubernetes(&kube::controller_kubeconfig(), kube::NAMESPACE, &|| {
        forget(exporters, clients)
    })?;
    if let Some(dir) = images {
        println!("== the container images under podman against this API server");
        crate::images_run::against_cluster(&dir)?;
    }
    let report = crate::kube_rollout::scenario(&crate::debug_build()?)?;
    crate::kube_rollout::print_report(&report);
    crate::kube_pools::scenario(&crate::debug_build()?)?;
    println!("== our exporter, jmp and j against upstream's Go controller and router");
    let rows = crate::go_controller::scenario(&crate::debug_build()?)?;
    crate::go_controller::print_matrix(&rows);
    let failed = rows.iter().filter(|r| r.1.is_err()).count();
    anyhow::ensure!(
        failed == 0,
        "{failed} of {} rows failed against upstream's Go controller",
        rows.len()
    );
    drop(cluster);
    println!("== kube-e2e passed");
    Ok(())
}

/// Removes what an earlier walkthrough on this cluster left (its Exporter and Client
/// `quickstart`, their credential Secrets and its Leases, all in namespace `default`), so
/// that `jmp admin create` can create them again.
fn forget_last_walkthrough() -> Result<()> {
    forget(&["quickstart"], &["quickstart"])
}

/// Deletes, in namespace `default`, the Exporters `exporters` and Clients `clients` with
/// their credential Secrets, and every Lease there (the suite's tests that keep leases in
/// `default` delete their own; what is left is from the walkthrough and interop scenarios).
fn forget(exporters: &[&str], clients: &[&str]) -> Result<()> {
    kube::delete_objects(exporters, clients)?;
    kube::kubectl(&[
        "delete",
        "-n",
        "default",
        "--all",
        "--ignore-not-found",
        "--wait=false",
        "leases.jumpstarter.dev",
    ])?;
    Ok(())
}
