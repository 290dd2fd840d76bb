//! `cargo xtask kube-e2e`: the Kubernetes backend against a real API server.
//!
//! Starts a cluster with [`crate::kube::up`] (stopped again at the end, also on failure), then:
//! 1. the Store contract suite (`store::tests::real_kube_backend`, the generic tests that
//!    also run against SQLite and the fake API server) as the cluster's admin;
//! 2. the controller's real-server tests (`tests/it/real_kube.rs`) as the controller's
//!    ServiceAccount, bound to the ClusterRole of `deploy/kubernetes/base/rbac.yaml`;
//! 3. the quickstart walkthrough (admin create, `jmp run`, `jmp get`, `jmp shell` with
//!    `j power on`) with `jumpstarter-controller --store kubernetes` as that ServiceAccount.

use anyhow::Result;

use crate::kube;

/// Runs the suite.
pub fn run() -> Result<()> {
    let cluster = kube::up()?;
    let admin = kube::admin_kubeconfig().display().to_string();
    let controller = kube::controller_kubeconfig().display().to_string();
    let feature = ["-p", "jumpstarter-controller", "--features", "kube-e2e"];
    println!(
        "== the Store contract suite against kube-apiserver {}",
        kube::K8S_VERSION
    );
    crate::cargo_with_env(
        &[
            &["test"],
            &feature[..],
            &["--lib", "store::tests::real_kube_backend::"],
        ]
        .concat(),
        &[("KUBECONFIG", &admin)],
    )?;
    println!("== the controller's real-server tests (as its ServiceAccount)");
    crate::cargo_with_env(
        &[&["test"], &feature[..], &["--test", "it", "real_kube::"]].concat(),
        &[
            ("KUBECONFIG", &admin),
            ("JMP_TEST_CONTROLLER_KUBECONFIG", &controller),
        ],
    )?;
    println!("== the quickstart with jumpstarter-controller --store kubernetes");
    crate::quickstart::walkthrough(
        &crate::target_dir().join("kube-e2e-lab"),
        &["--store", "kubernetes", "--namespace", kube::NAMESPACE],
        &[("KUBECONFIG", &controller)],
    )?;
    drop(cluster);
    println!("== kube-e2e passed");
    Ok(())
}
