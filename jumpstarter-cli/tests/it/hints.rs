//! Errors that know the fix say it: what a person reads when direct mode's TLS settings do
//! not match the exporter's, or a driver `type:` has a typo.

use std::process::Output;

use crate::{J, JMP, Scratch, start_exporter, text};

/// `jmp config direct certs ARGS --out . --ca-dir ca` in the scratch directory.
fn make_certs(s: &Scratch, names: &[&str]) {
    let out = s
        .cmd(JMP)
        .args(["config", "direct", "certs"])
        .args(names)
        .args(["--out", ".", "--ca-dir", "ca"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{:?}", text(&out));
}

/// An exporter on loopback serving the certificate `jmp config direct certs` wrote.
fn tls_exporter(s: &Scratch) -> (crate::Running, u16) {
    start_exporter(
        s,
        &["--tls-cert", "server.pem", "--tls-key", "server-key.pem"],
    )
}

/// `jmp shell --tls-grpc 127.0.0.1:PORT ARGS -- j power on`: its exit code and stderr, with
/// the port written `PORT`.
fn shell(s: &Scratch, port: u16, args: &[&str]) -> (Option<i32>, String) {
    let addr = format!("127.0.0.1:{port}");
    let out: Output = s
        .cmd(JMP)
        .args(["shell", "--tls-grpc", &addr])
        .args(args)
        .args(["--", J, "power", "on"])
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    (out.status.code(), stderr.replace(&port.to_string(), "PORT"))
}

/// A client that does not trust the CA of `jmp config direct certs` is told to pass the
/// `ca.pem` that command wrote.
#[test]
fn a_client_without_the_ca_is_told_to_pass_tls_ca() {
    let s = Scratch::new();
    make_certs(&s, &["--host", "localhost", "--ip", "127.0.0.1"]);
    let (_exporter, port) = tls_exporter(&s);
    let (code, stderr) = shell(&s, port, &[]);
    assert_eq!(code, Some(1), "{stderr}");
    insta::assert_snapshot!(stderr, @r"
    Error: cannot connect to 127.0.0.1:PORT: the exporter's certificate is not signed by a CA this client trusts: transport error: invalid peer certificate: UnknownIssuer
    Pass the CA certificate that `jmp config direct certs` wrote beside the exporter's server.pem: jmp shell --tls-grpc 127.0.0.1:PORT --tls-ca ca.pem ...
    ");
    // A CA that did not sign it reads the same.
    let other = s.write("other.pem", &rcgen_ca_pem());
    let (code, stderr_other) = shell(&s, port, &["--tls-ca", other.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{stderr_other}");
    assert_eq!(stderr_other, stderr);
    // With it, the shell runs.
    let (code, stderr) = shell(&s, port, &["--tls-ca", "ca.pem"]);
    assert_eq!(code, Some(0), "{stderr}");
}

/// A self-signed CA certificate, not the one that signed the exporter's.
fn rcgen_ca_pem() -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.self_signed(&key).unwrap().pem()
}

/// A TLS client against `jmp run --tls-grpc-insecure` is told the exporter speaks plaintext
/// and to add `--tls-grpc-insecure`, as the reverse mismatch is told to drop it.
#[test]
fn a_tls_client_of_a_plaintext_exporter_is_told_to_add_tls_grpc_insecure() {
    let s = Scratch::new();
    make_certs(&s, &["--host", "localhost", "--ip", "127.0.0.1"]);
    let (_exporter, port) = start_exporter(&s, &["--tls-grpc-insecure"]);
    // How the exporter's end of the connection reads (a reset, an early end) is the
    // kernel's: the transport's words are left out.
    let transport = |stderr: &str| match stderr.split_once(": transport error: ") {
        Some((head, _)) => format!("{head}: transport error: ...)"),
        None => stderr.to_string(),
    };
    let (code, stderr) = shell(&s, port, &["--tls-ca", "ca.pem"]);
    assert_eq!(code, Some(1), "{stderr}");
    insta::assert_snapshot!(transport(&stderr), @"Error: the exporter at 127.0.0.1:PORT looks plaintext (no TLS: it runs with --tls-grpc-insecure) and we spoke TLS: add --tls-grpc-insecure here too, or give `jmp run` --tls-cert and --tls-key (cannot connect to 127.0.0.1:PORT: the exporter answers in plaintext HTTP/2, without TLS: transport error: ...)");
    // Without --tls-ca: the same.
    let (code, without_ca) = shell(&s, port, &[]);
    assert_eq!(code, Some(1), "{without_ca}");
    assert_eq!(transport(&without_ca), transport(&stderr));

    // The reverse, as before: a plaintext client of a TLS exporter.
    let (_tls, tls_port) = tls_exporter(&s);
    let (code, stderr) = shell(&s, tls_port, &["--tls-grpc-insecure"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.starts_with(
            "Error: the exporter at 127.0.0.1:PORT closed the connection: it probably speaks TLS"
        ) && stderr.contains("the exporter speaks TLS, and this client spoke plaintext HTTP/2"),
        "{stderr}"
    );
}

/// Connecting by a name the certificate does not have says how to make one that has it.
#[test]
fn a_name_not_in_the_certificate_says_how_to_make_one_with_it() {
    let s = Scratch::new();
    make_certs(&s, &["--host", "localhost"]);
    let (exporter, port) = tls_exporter(&s);
    let (code, stderr) = shell(&s, port, &["--tls-ca", "ca.pem"]);
    assert_eq!(code, Some(1), "{stderr}");
    insta::assert_snapshot!(stderr, @r#"
    Error: cannot connect to 127.0.0.1:PORT: the exporter's certificate is not valid for "127.0.0.1" (it is for localhost): transport error: invalid peer certificate: certificate not valid for name "127.0.0.1"; certificate is only valid for DnsName("localhost")
    Connect by a name it is for (localhost), or make the exporter a certificate for 127.0.0.1 too: `jmp config direct certs --host localhost --ip 127.0.0.1 --out . --force` (add --ca-dir DIR if its CA is not the default one), and restart `jmp run` with the new server.pem and server-key.pem.
    "#);
    // The command it gives makes a certificate the client accepts under that name.
    let command = stderr
        .lines()
        .find_map(|l| l.split_once("`jmp ").map(|(_, c)| c))
        .and_then(|c| c.split_once('`').map(|(c, _)| c.to_string()))
        .unwrap_or_else(|| panic!("no command in: {stderr}"));
    let args: Vec<&str> = command.split_whitespace().collect();
    let out = s
        .cmd(JMP)
        .args(&args)
        .args(["--ca-dir", "ca"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{command}: {:?}", text(&out));
    drop(exporter);
    let (_exporter, port) = tls_exporter(&s);
    let (code, stderr) = shell(&s, port, &["--tls-ca", "ca.pem"]);
    assert_eq!(code, Some(0), "{stderr}");
}

/// The exporter config of [`crate::MOCK_CONFIG`] with another power `type:`.
fn config_with_power_type(type_name: &str) -> String {
    crate::MOCK_CONFIG.replace("jumpstarter_driver_power.driver.MockPower", type_name)
}

/// `jmp shell --exporter-config exporter.yaml -- true` with `type_name` for its power
/// driver, no Python interpreter to fall back on: its stderr.
fn local_shell_with_type(type_name: &str) -> String {
    let s = Scratch::new();
    s.write("exporter.yaml", &config_with_power_type(type_name));
    let out = s
        .cmd(JMP)
        .args(["shell", "--exporter-config", "exporter.yaml", "--", "true"])
        .env("JMP_PYTHON", s.path("no-such-python"))
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    stderr
}

/// A one-letter typo in a type a Rust driver serves: "did you mean", not `pip install`.
#[test]
fn a_typo_in_a_driver_type_says_did_you_mean() {
    insta::assert_snapshot!(local_shell_with_type("jumpstarter_driver_power.driver.MockPowr"), @r#"Error: exporter e2e: exporter.yaml:10: export.power.type: unknown driver type "jumpstarter_driver_power.driver.MockPowr": did you mean "jumpstarter_driver_power.driver.MockPower"?"#);
    // In the module's name too.
    let stderr = local_shell_with_type("jumpstarter_driver_powr.driver.MockPower");
    assert!(
        stderr.contains("did you mean \"jumpstarter_driver_power.driver.MockPower\"?"),
        "{stderr}"
    );
    assert!(!stderr.contains("pip install"), "{stderr}");
}

/// A type of a module the Rust drivers serve, with no close match: the module's Rust types,
/// not `pip install`.
#[test]
fn an_unknown_type_of_a_rust_module_names_the_modules_rust_types() {
    insta::assert_snapshot!(local_shell_with_type("jumpstarter_driver_power.driver.Foo"), @r#"Error: exporter e2e: exporter.yaml:10: export.power.type: unknown driver type "jumpstarter_driver_power.driver.Foo": the Rust drivers of module jumpstarter_driver_power.driver are MockPower and SyncMockPower; Python could not serve it either (docs/python-drivers.md)"#);
}

/// A type of a module no Rust driver serves still says what to install for Python.
#[test]
fn an_unknown_type_of_another_module_still_says_what_to_install() {
    let stderr = local_shell_with_type("acme_relays.driver.Relay");
    assert!(!stderr.contains("did you mean"), "{stderr}");
    assert!(stderr.contains("acme-relays"), "{stderr}");
}

/// `jmp config exporter edit` checks with the same code: a typo gets "did you mean" too.
#[test]
fn config_exporter_edit_says_did_you_mean() {
    let s = Scratch::new();
    let out = s
        .cmd(JMP)
        .args(["config", "exporter", "create", "lab"])
        .args(["--endpoint", "ctl:443", "--token", "t"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{:?}", text(&out));
    let editor = s.write(
        "editor.sh",
        "#!/bin/sh\nsed -i 's/^export:$/export:\\n  power:\\n    type: \
         jumpstarter_driver_power.driver.MockPowr/' \"$1\"\n",
    );
    let out = s
        .cmd(JMP)
        .env("VISUAL", format!("sh {}", editor.display()))
        .env("JMP_PYTHON", s.path("no-such-python"))
        .args(["config", "exporter", "edit", "lab"])
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "unknown driver type \"jumpstarter_driver_power.driver.MockPowr\": did you mean \
             \"jumpstarter_driver_power.driver.MockPower\"?"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("pip install"), "{stderr}");
}
