//! Developer tasks: `cargo xtask ci | interop | bench`.

mod arch;
mod arch_errors;
mod bench;
mod bench_boards;
mod bench_bridge;
mod bench_console;
mod bench_controller;
mod bench_dashboard;
mod bench_direct;
mod bench_obs;
mod bench_observers;
mod bench_pools;
mod bench_scale;
mod bench_startup;
mod bench_storage;
mod bench_table;
mod bench_tunnels;
mod boot_tools;
mod cdp;
mod ci;
mod ci_summary;
mod conformance;
mod crds;
mod dashboard_e2e;
mod faults;
mod fuzz;
mod go_controller;
mod images;
mod images_check;
mod images_dockerfile;
mod images_layout;
mod images_run;
mod interop;
mod kube;
mod kube_e2e;
mod kube_oidc;
mod kube_podlet;
mod kube_pools;
mod kube_rollout;
mod lab_harness;
mod manifests;
mod podman;
mod procs;
mod prometheus;
mod qemu_board;
mod quickstart;
mod s3;
mod snmpd;
mod workspace;

use anyhow::Result;

pub use workspace::{
    TEST_FEATURES, cache_root, cargo, cargo_command, cargo_with_env, debug_build, target_dir,
    workspace_root,
};

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("ci") => ci::run(&args[1..]),
        // Hidden: the background steps of `ci` (started by it, output in target/ci/).
        Some("ci-prepare") => ci::prepare(),
        Some("kube-build") => ci::kube_build(),
        Some("arch") => arch::run(),
        Some("interop") => interop::run(args.get(1).map(String::as_str)).map(|_| ()),
        Some("bench") => bench(&args[1..]),
        // Hidden: the Python-driver bridge part of `bench` alone (`--quick`, `--debug`).
        Some("bench-bridge") => bench_bridge::run(&args[1..]),
        // Hidden: the controller scale part of `bench` alone (`--quick`: 100 and 1,000).
        Some("bench-controller") => bench_controller::run(&args[1..]),
        Some("bench-scale") => bench_scale::run(&args[1..]),
        // Hidden: the console and port-forwarding part of `bench` alone (`--quick`: small).
        Some("bench-console") => bench_console::run(&args[1..]),
        // Hidden: the console observers part of `bench` alone (`--quick`, `--debug`,
        // `--no-build`, `--rounds N`).
        Some("bench-observers") => bench_observers::run(&args[1..]),
        // Hidden: the direct-path-vs-router part of `bench` alone (`--quick`: 64 MiB).
        Some("bench-direct") => bench_direct::run(&args[1..]),
        // Hidden: the `jmp` start-up part of `bench` alone (`--quick`: 3 runs each).
        Some("bench-startup") => bench_startup::run(&args[1..]),
        // Hidden: the metrics and JSON logs overhead part of `bench` alone (`--quick`).
        Some("bench-obs") => bench_obs::run(&args[1..]),
        // Hidden: the virtual target pools part of `bench` alone (`--quick`: 3 runs each,
        // `--debug`, `--no-qemu`).
        Some("bench-pools") => bench_pools::run(&args[1..]),
        // Hidden: the web dashboard part of `bench` alone (`--quick`, `--debug`, `--exporters N`).
        Some("bench-dashboard") => bench_dashboard::run(&args[1..]),
        // Hidden: the storage part of `bench` alone (`--size-mib N`, `--ours-only`).
        Some("bench-storage") => bench_storage::run(&args[1..]),
        // Hidden: the QEMU board part of `bench` alone (`--size-mib N`, `--quick`).
        Some("bench-boards") => bench_boards::run(&args[1..]),
        Some("crds") => crds::run(&args[1..]),
        Some("faults") => faults::run(&args[1..]),
        Some("fuzz") => fuzz::run(&args[1..]),
        Some("images") => images::run(&args[1..]),
        Some("images-run") => images_run::run(&args[1..]),
        Some("quickstart") => quickstart::run(&args[1..]),
        Some("lab-harness") => lab_harness::run(&args[1..]),
        Some("dashboard-e2e") => dashboard_e2e::run(&args[1..]),
        Some("s3") => s3::run(),
        Some("kube-up") => kube::run_up(),
        Some("kube-down") => kube::run_down(),
        Some("kube-e2e") => kube_e2e::run(&args[1..]),
        Some("go-controller") => go_controller::run(&args[1..]),
        Some("kube-rollout") => kube_rollout::run(&args[1..]),
        Some("kube-pools") => kube_pools::run(&args[1..]),
        // Hidden: the controller failover part of `bench` alone.
        Some("bench-failover") => kube_rollout::bench(),
        Some("manifests") => manifests::run(&args[1..]),
        // Hidden: the ServiceAccount-token step of kube-e2e alone, on the kube-up cluster
        // (with the binaries already in target/debug).
        Some("kube-oidc") => kube::running().and_then(|()| kube_oidc::run()),
        Some("qemu-board") => qemu_board::run(),
        Some("venv") => interop::ensure_venv().map(|p| println!("{}", p.display())),
        _ => {
            eprintln!(
                "usage: cargo xtask <task>\n\n\
                 tasks:\n  \
                 ci        [--timings] [--full] fmt, arch, clippy and rustdoc -D warnings, all tests and suites (what CI runs)\n  \
                 arch      no import cycles between a crate's files; the controller without compression crates; no error message repeats its source\n  \
                 interop   [FILTER] upstream Python 0.9.0 tools against ours (builds a venv)\n  \
                 bench     [--quick] latency/throughput, ours vs upstream Python, in one run\n  \
                 bench-scale [--quick] [--exporters N] [--per-conn K] [--only controller|router] 10,000 live exporters on one controller, 1,000 tunnels through one router\n  \
                 crds      [--out DIR | --check DIR] our CRD YAML (stdout), written, or compared\n  \
                 images    [--out DIR] [--tag TAG] [--debug] the images of deploy/docker without a container engine, checked\n  \
                 images-run [--dir DIR] [--layout] those images compared with podman build of their Dockerfiles, and run by podman against the kube-up API server\n  \
                 faults    [--seed N] [--rounds N] [--quick] [--release] kill processes of a lab day at random, check nothing is lost\n  \
                 fuzz      [--cases N] [--target FILTER] [--seed N] every fuzz target with many more cases (20,000) than cargo test\n  \
                 quickstart  the whole lab on one machine: controller, mock exporter, client, jmp shell\n  \
                 lab-harness examples/lab-harness (the jumpstarter-core facade) against a local lab with a mock board\n  \
                 dashboard-e2e [--update-docs] [--no-build] the web dashboard in headless chromium against a local lab; screenshots in target/ci-artifacts/dashboard\n  \
                 s3        the Opendal driver's S3 service (feature storage-s3) against moto's S3 on loopback\n  \
                 kube-up   a real kube-apiserver + etcd on loopback (built from Go modules, cached)\n  \
                 kube-down stop what kube-up started\n  \
                 kube-e2e  [--reuse] [--images DIR] the Kubernetes store and controller against that real API server (and the images of DIR under podman)\n  \
                 go-controller [--reuse] upstream's 0.9.0 Go controller and router (built from ../shared, cached) driven by our exporter, jmp and j on that API server\n  \
                 kube-rollout [--reuse] [--no-build] deploy/kubernetes with kube-controller-manager and a stand-in node: rollouts, the leader killed under load\n  \
                 kube-pools [--reuse] [--no-build] a virtual target pool (qemu.jumpstarter.dev) on that API server: Pods on a stand-in node, leases served, scaling, garbage collection\n  \
                 manifests [--cluster] deploy/kubernetes validated strictly offline (several Kubernetes versions); --cluster: applied to the kube-up API server, RBAC as the controller\n  \
                 qemu-board  install QEMU and build the test board image (cached); print its path\n  \
                 venv      create the pinned upstream venv and print its path"
            );
            return std::process::ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Call benchmarks, then storage benchmarks (`--quick`: small counts and 64 MiB).
fn bench(args: &[String]) -> Result<()> {
    let quick = args.iter().any(|a| a == "--quick");
    bench::run(args)?;
    bench_obs::run(args)?;
    bench_startup::run(args)?;
    let storage_args: Vec<String> = if quick {
        vec!["--size-mib".into(), "64".into()]
    } else {
        args.iter().filter(|a| *a != "--quick").cloned().collect()
    };
    bench_storage::run(&storage_args)?;
    bench_direct::run(args)?;
    bench_console::run(args)?;
    bench_observers::run(args)?;
    bench_boards::run(args)?;
    bench_bridge::run(args)?;
    bench_controller::run(args)?;
    bench_pools::run(args)?;
    bench_dashboard::run(args)?;
    kube_rollout::bench()
}
