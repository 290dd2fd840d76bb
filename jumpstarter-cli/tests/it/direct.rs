//! Direct mode: `jmp run --tls-grpc-listener` and `jmp shell --tls-grpc`.

use crate::{J, JMP, Scratch, start_exporter, text};

#[test]
fn plaintext_with_passphrase() {
    let s = Scratch::new();
    let (_exporter, port) = start_exporter(&s, &["--tls-grpc-insecure", "--passphrase", "pw"]);
    let addr = format!("127.0.0.1:{port}");
    let out = s
        .cmd(JMP)
        .args([
            "shell",
            "--tls-grpc",
            &addr,
            "--tls-grpc-insecure",
            "--passphrase",
            "pw",
            "--",
        ])
        .args([J, "power", "read"])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("voltage=5.0 V"), "{stdout}");

    let out = s
        .cmd(JMP)
        .args([
            "shell",
            "--tls-grpc",
            &addr,
            "--tls-grpc-insecure",
            "--passphrase",
            "bad",
            "--",
        ])
        .args([J, "power", "on"])
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr.trim(),
        "Error: Authentication failed: invalid or missing passphrase"
    );

    // j alone, with the variables jmp shell would set.
    let out = s
        .cmd(J)
        .env("JUMPSTARTER_HOST", &addr)
        .env("JMP_GRPC_INSECURE", "1")
        .env("JMP_GRPC_PASSPHRASE", "pw")
        .args(["power", "cycle", "--wait", "0"])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert_eq!(stdout, "Power cycling with 0 seconds wait time...\n");

    // Exit codes pass through the direct shell too.
    let out = s
        .cmd(JMP)
        .args([
            "shell",
            "--tls-grpc",
            &addr,
            "--tls-grpc-insecure",
            "--passphrase",
            "pw",
            "--",
        ])
        .args(["sh", "-c", "test \"$JMP_LEASE\" = direct && exit 4"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4));
}

#[test]
fn tls_listener_with_own_certificate() {
    let s = Scratch::new();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let cert_path = s.write("cert.pem", &cert.pem());
    let key_path = s.write("key.pem", &key.serialize_pem());
    let (_exporter, port) = start_exporter(
        &s,
        &[
            "--tls-cert",
            cert_path.to_str().unwrap(),
            "--tls-key",
            key_path.to_str().unwrap(),
        ],
    );
    let addr = format!("localhost:{port}");
    let out = s
        .cmd(JMP)
        .args([
            "shell",
            "--tls-grpc",
            &addr,
            "--tls-ca",
            "cert.pem",
            "--",
            J,
            "power",
            "on",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{:?}", text(&out));
    // Without trusting the certificate, the shell refuses to start.
    let out = s
        .cmd(JMP)
        .args(["shell", "--tls-grpc", &addr, "--", J, "power", "on"])
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.starts_with("Error: cannot connect to"), "{stderr}");
}

#[test]
fn run_refuses_unusable_options() {
    let s = Scratch::new();
    let cases: &[(&[&str], &str)] = &[
        (
            &["run", "--exporter-config", "exporter.yaml"],
            "controller mode",
        ),
        (
            &[
                "run",
                "--exporter-config",
                "exporter.yaml",
                "--tls-grpc-listener",
                "127.0.0.1:0",
            ],
            "--tls-cert",
        ),
        (
            &[
                "run",
                "--exporter-config",
                "exporter.yaml",
                "--tls-grpc-listener",
                "nope:port",
                "--tls-grpc-insecure",
            ],
            "invalid port",
        ),
        (&["run"], "no exporter given"),
    ];
    for (args, needle) in cases {
        let out = s.cmd(JMP).args(*args).output().unwrap();
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}
