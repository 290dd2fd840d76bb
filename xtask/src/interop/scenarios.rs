//! The scenario table: which checks `cargo xtask interop` runs, in which order, and the
//! subset that runs against the Kubernetes store.

use super::*;

/// Runs every scenario whose name contains `filter`; returns how many passed of how many
/// ran (all of them, or it fails).
pub fn run(filter: Option<&str>) -> Result<(usize, usize)> {
    let venv = ensure_venv()?;
    let bin = crate::debug_build()?;
    let env = Env {
        venv,
        jmp: bin.join("jmp"),
        j: bin.join("j"),
        work: tempfile_dir::Dir::new("jmp-interop")?,
        scripts: Path::new(env!("CARGO_MANIFEST_DIR")).join("interop"),
        store: ControllerStore::Sqlite,
    };
    std::fs::write(env.config(), EXPORTER_CONFIG)?;

    type Scenario = fn(&Env) -> Result<()>;
    let scenarios: &[(&str, Scenario)] = &[
        (
            "descriptor conformance (jumpstarter-protocol 0.9.0)",
            conformance,
        ),
        (
            "python j power on/read -> our exporter, unix socket",
            py_j_unix,
        ),
        (
            "python env() script -> our exporter, unix socket",
            py_script_unix,
        ),
        (
            "python j + script -> our exporter, direct TCP plaintext",
            py_direct_plain,
        ),
        (
            "python jmp shell --tls-grpc -> our exporter",
            py_shell_tls_grpc,
        ),
        (
            "python client -> our exporter, direct TCP with passphrase",
            py_direct_passphrase,
        ),
        (
            "our j power on/read -> python exporter, direct TCP",
            rs_j_to_py_tcp,
        ),
        (
            "our j power on/read -> python exporter, unix socket",
            rs_j_to_py_unix,
        ),
        (
            "storage: python client 64 MiB round trip -> our exporter, unix socket",
            storage_py_client_to_ours,
        ),
        (
            "storage: our j 64 MiB round trip + gzip flash -> python exporter, unix socket",
            storage_rs_client_to_py,
        ),
        (
            "storage: our j gzip flash, python exporter refusing encodings (local fallback)",
            storage_rs_client_fallback,
        ),
        (
            "storage: python OpendalClient 64 MiB round trip -> our Opendal(fs) exporter, unix socket",
            opendal_py_client_to_ours,
        ),
        (
            "storage: our j opendal 64 MiB round trip + gzip upload -> python Opendal(fs) exporter, unix socket",
            opendal_rs_client_to_py,
        ),
        (
            "console: python PySerialClient.pexpect() + TcpPortforwardAdapter -> our exporter, pty board",
            console::py_client_to_our_exporter,
        ),
        (
            "console: our j net address/forward-tcp + serial pipe -> python exporter, pty board",
            console::our_j_to_py_exporter,
        ),
        (
            "console: python PySerialClient.pexpect() + TcpPortforwardAdapter -> our exporter, our controller+router",
            console::py_client_to_our_exporter_routed,
        ),
        (
            "console: our jmp shell + j net address/forward-tcp + serial pipe -> python exporter, our controller+router",
            console::our_j_to_py_exporter_routed,
        ),
        (
            "console: python jmp shell owns a lease on our exporter and uses connect (pexpect) while our j serial pipe --observe on the shared lease (jmp share) sees the same bytes",
            console::py_owner_with_our_observer_routed,
        ),
        (
            "shell: python j sh METHOD (exit code, env, args, --help) -> our Shell exporter",
            boards::py_j_to_our_shell,
        ),
        (
            "shell: our j sh METHOD -> python Shell exporter, unix socket",
            boards::our_j_to_py_shell,
        ),
        (
            "boards: python QemuFlasherClient flash from a URL + OpendalClient on Opendal(http) -> our exporter",
            boards::py_client_flashes_from_a_url,
        ),
        (
            "boards: python PowerClient + j -> our HttpPower exporter -> local HTTP plug",
            boards::py_client_to_our_http_power,
        ),
        (
            "qemu: python QemuClient flash, power, console.pexpect() to the prompt -> our Qemu exporter",
            qemu::py_client_to_our_qemu,
        ),
        (
            "snmp: python j pdu on/off/cycle -> our SNMPServer exporter -> snmpd (SHA/AES)",
            snmp::py_j_to_our_snmp,
        ),
        (
            "snmp: our j pdu on/off -> python SNMPServer exporter -> snmpd (SHA/AES)",
            snmp::our_j_to_py_snmp,
        ),
        (
            "controller: python jmp run + jmp get/create/delete leases, shell, a shared lease -> our controller",
            controller::py_tools_against_our_controller,
        ),
        (
            "pools: python jmp shell -l pool=interop -- j power on/off -> a replica our controller starts for the lease (local provisioner, MockPower)",
            pools::py_client_leases_a_pool_replica,
        ),
        (
            "distributed: our jmp shell + j (power, 64 MiB storage) -> python exporter, our controller+router",
            distributed::our_client_to_py_exporter,
        ),
        (
            "distributed: python jmp shell + j (power, 64 MiB storage) -> our exporter, our controller+router",
            distributed::py_client_to_our_exporter,
        ),
        (
            "custom driver: python client class + j -> example my-jmp (Rust Chamber), our controller+router",
            custom::py_client_to_custom_driver,
        ),
        (
            "driver tests: upstream's 0.9.0 driver packages' pytest tests, each driver served by our exporter",
            driver_tests::upstream_driver_tests,
        ),
        (
            "python drivers: our j + python client -> our exporter (Rust MockPower, Python Shell + MockFlasher), local",
            bridge::local,
        ),
        (
            "python drivers: our j + python client -> our exporter (Rust MockPower, Python Shell + MockFlasher), direct TCP; 256 MiB flash keeps memory flat",
            bridge::direct,
        ),
        (
            "python drivers: our j + python client + python j -> our exporter (Rust MockPower, Python Shell + MockFlasher), our controller+router",
            bridge::distributed,
        ),
        (
            "hooks: our jmp shell -> python exporter with beforeLease/afterLease, output in order",
            distributed::our_client_to_py_exporter_with_hooks,
        ),
        (
            "hooks: python jmp shell -> our exporter with beforeLease/afterLease, output in order",
            distributed::py_client_to_our_exporter_with_hooks,
        ),
        (
            "lease end: python client's open connection -> our exporter refuses its calls while the afterLease hook runs",
            distributed::py_raw_client_is_refused_after_the_lease_ended,
        ),
        (
            "one exporter twice: python jmp run as a second process of our online exporter is refused; stopping it takes nothing offline",
            distributed::py_second_exporter_process_is_refused,
        ),
        (
            "upstream main: python jmp shell --tls-grpc -- j -> our exporter with a motd and a beforeLease hook writing $JMP_MOTD_FILE",
            upstream_main::py_client_to_our_exporter_with_motd,
        ),
        (
            "upstream main: python jmp get exporters/create lease/get leases -> our controller with hidden and deprecated labels (--config)",
            upstream_main::py_tools_with_hidden_and_deprecated_labels,
        ),
    ];
    let (mut passed, mut failed) = (0, 0);
    let mut failures = Vec::new();
    for (name, f) in scenarios {
        if filter.is_some_and(|flt| !name.contains(flt)) {
            continue;
        }
        println!("-- {name}");
        match f(&env) {
            Ok(()) => {
                println!("   ok");
                passed += 1;
            }
            Err(e) => {
                println!("   FAILED: {e:#}");
                failures.push(name.to_string());
                failed += 1;
            }
        }
    }
    println!("interop: {passed} passed, {failed} failed");
    if failed > 0 {
        bail!("interop scenarios failed: {}", failures.join("; "));
    }
    Ok((passed, passed + failed))
}

/// Upstream's exporter (`jmp run`) and client (`jmp get/create/delete leases`, `jmp shell`
/// with `j power on`), and our `jmp shell` with `j` against the upstream exporter, through our
/// controller keeping its objects in the cluster `kubeconfig` names (`cargo xtask kube-e2e`).
/// `forget` runs before each scenario: it removes the objects the scenarios create
/// ([`KUBE_SCENARIO_OBJECTS`]), which a cluster keeps from an earlier scenario or run.
pub fn against_kubernetes(
    kubeconfig: &Path,
    namespace: &str,
    forget: &dyn Fn() -> Result<()>,
) -> Result<()> {
    let venv = ensure_venv()?;
    let bin = crate::debug_build()?;
    let env = Env {
        venv,
        jmp: bin.join("jmp"),
        j: bin.join("j"),
        work: tempfile_dir::Dir::new("jmp-interop-kube")?,
        scripts: Path::new(env!("CARGO_MANIFEST_DIR")).join("interop"),
        store: ControllerStore::Kubernetes {
            kubeconfig: kubeconfig.to_path_buf(),
            namespace: namespace.to_owned(),
        },
    };
    type Scenario = fn(&Env) -> Result<()>;
    let scenarios: &[(&str, Scenario)] = &[
        (
            "python jmp run + python jmp get/create/delete leases, jmp shell -- j power on -> our controller --store kubernetes",
            controller::py_tools_against_our_controller,
        ),
        (
            "our jmp shell + j (power, 64 MiB storage) -> python exporter, our controller --store kubernetes",
            distributed::our_client_to_py_exporter,
        ),
    ];
    for (name, f) in scenarios {
        println!("-- {name}");
        forget()?;
        f(&env).with_context(|| name.to_string())?;
        println!("   ok");
    }
    forget()
}

/// The Exporters and Clients (in namespace `default`) the scenarios of
/// [`against_kubernetes`] create; their credential Secrets are `<name>-exporter` and
/// `<name>-client`.
pub const KUBE_SCENARIO_OBJECTS: (&[&str], &[&str]) =
    (&["py-exporter"], &["py-client", "rs-client", "rs-owner"]);
