//! `jmp config direct certs`: the TLS files of direct mode (`server.pem`, `server-key.pem`,
//! `ca.pem`), made with our own CA code rather than an openssl recipe.
//!
//! The CA lives in a directory of its own (default `CONFIG_DIR/direct-ca`: `ca.crt`, and
//! `ca.key` with mode 0600) and is reused for every exporter, so clients trust one `ca.pem`
//! for all of them; its key never goes into the output directory.

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use jumpstarter_core::{auth::CertificateAuthority, config::config_dir};

/// `jmp config direct`.
#[derive(Subcommand, Debug)]
pub enum DirectCommand {
    /// Make the TLS files of a direct-mode exporter: server.pem, server-key.pem (its
    /// certificate and key, for `jmp run --tls-cert/--tls-key`) and ca.pem (for clients'
    /// `jmp shell --tls-ca`).
    Certs(CertsArgs),
}

/// `jmp config direct certs`.
#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("names").required(true).multiple(true).args(["host", "ip"])))]
pub struct CertsArgs {
    /// Host name clients use to reach the exporter (repeatable).
    #[arg(long, value_name = "NAME")]
    host: Vec<String>,
    /// IP address clients use to reach the exporter (repeatable).
    #[arg(long, value_name = "ADDR")]
    ip: Vec<IpAddr>,
    /// Directory to write server.pem, server-key.pem and ca.pem into.
    #[arg(long, value_name = "DIR", default_value = ".")]
    out: PathBuf,
    /// Directory of the CA that signs the certificate (created when empty). Default:
    /// CONFIG_DIR/direct-ca, e.g. ~/.config/jumpstarter/direct-ca.
    #[arg(long, value_name = "DIR")]
    ca_dir: Option<PathBuf>,
    /// Replace server.pem, server-key.pem and ca.pem when they exist.
    #[arg(long)]
    force: bool,
}

/// The files written into `--out`.
pub const SERVER_CERT: &str = "server.pem";
/// The server's private key (mode 0600).
pub const SERVER_KEY: &str = "server-key.pem";
/// The CA certificate clients trust.
pub const CA_PEM: &str = "ca.pem";

/// The default CA directory: `CONFIG_DIR/direct-ca`.
pub fn default_ca_dir() -> PathBuf {
    config_dir().join("direct-ca")
}

/// Runs `jmp config direct ...`.
pub fn run(cmd: DirectCommand) -> Result<i32> {
    let DirectCommand::Certs(args) = cmd;
    certs(&args)?;
    Ok(0)
}

fn certs(args: &CertsArgs) -> Result<()> {
    let mut sans: Vec<String> = args.host.iter().map(|h| h.trim().to_string()).collect();
    if let Some(bad) = sans.iter().find(|h| !dns_name(h)) {
        bail!(
            "invalid --host {bad:?}: give a DNS name such as board1.lab (IP addresses go in --ip)"
        );
    }
    sans.extend(args.ip.iter().map(IpAddr::to_string));
    let targets = [SERVER_CERT, SERVER_KEY, CA_PEM].map(|f| args.out.join(f));
    if !args.force
        && let Some(existing) = targets.iter().find(|p| p.exists())
    {
        bail!(
            "{} exists; pass --force to replace it (nothing was written)",
            existing.display()
        );
    }
    let ca_dir = args.ca_dir.clone().unwrap_or_else(default_ca_dir);
    let ca = CertificateAuthority::load_or_create(&ca_dir, "Jumpstarter direct-mode CA")
        .with_context(|| format!("cannot use the CA in {}", ca_dir.display()))?;
    let server = ca
        .issue_server_cert(&sans)
        .context("cannot issue the server certificate")?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let [cert, key, ca_pem] = &targets;
    server.save(cert, key)?;
    write_file(ca_pem, ca.cert_pem().as_bytes())?;
    eprintln!(
        "Wrote {} and {} (for {}), signed by the CA in {}, and its certificate {}.",
        cert.display(),
        key.display(),
        sans.join(", "),
        ca_dir.display(),
        ca_pem.display(),
    );
    eprintln!(
        "Exporter: jmp run --exporter-config exporter.yaml --tls-grpc-listener [ADDRESS:]PORT \\"
    );
    eprintln!(
        "              --tls-cert {} --tls-key {}",
        cert.display(),
        key.display()
    );
    eprintln!(
        "Client:   jmp shell --tls-grpc {}:PORT --tls-ca {}",
        bracketed(&sans[0]),
        ca_pem.display()
    );
    eprintln!(
        "(A PORT alone listens on every network interface; 127.0.0.1:PORT on this machine only.)"
    );
    Ok(())
}

/// Whether `name` is a DNS host name: dot-separated labels of letters, digits and `-`
/// (not at either end of a label), at most 63 bytes each and 253 in all; not an address.
fn dns_name(name: &str) -> bool {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    name.len() <= 253 && name.parse::<IpAddr>().is_err() && name.split('.').all(label_ok)
}

/// An IPv6 address in `[...]`, as in `HOST:PORT`.
fn bracketed(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(out: &Path, hosts: &[&str], ips: &[&str]) -> CertsArgs {
        CertsArgs {
            host: hosts.iter().map(|s| s.to_string()).collect(),
            ip: ips.iter().map(|s| s.parse().unwrap()).collect(),
            out: out.join("out"),
            ca_dir: Some(out.join("ca")),
            force: false,
        }
    }

    #[test]
    fn writes_the_three_files_and_keeps_the_ca_for_the_next_exporter() {
        let dir = tempfile::tempdir().unwrap();
        let a = args(dir.path(), &["board1.lab"], &["127.0.0.1"]);
        certs(&a).unwrap();
        let ca1 = std::fs::read_to_string(a.out.join(CA_PEM)).unwrap();
        assert!(ca1.contains("BEGIN CERTIFICATE"));
        let key = a.out.join(SERVER_KEY);
        assert!(
            std::fs::read_to_string(&key)
                .unwrap()
                .contains("PRIVATE KEY")
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // The CA key stays in the CA directory.
        assert!(!a.out.join("ca.key").exists());

        // Existing files are not replaced without --force, and nothing changes.
        let cert1 = std::fs::read(a.out.join(SERVER_CERT)).unwrap();
        let e = certs(&a).unwrap_err().to_string();
        assert!(e.contains("--force"), "{e}");
        assert_eq!(std::fs::read(a.out.join(SERVER_CERT)).unwrap(), cert1);

        // With --force: a new server certificate from the same CA.
        let a = CertsArgs { force: true, ..a };
        certs(&a).unwrap();
        assert_ne!(std::fs::read(a.out.join(SERVER_CERT)).unwrap(), cert1);
        assert_eq!(std::fs::read_to_string(a.out.join(CA_PEM)).unwrap(), ca1);
    }

    #[test]
    fn bad_names_are_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().unwrap();
        for host in ["", "10.0.0.1", "not a name", "-x.lab", "a..b", "x/y"] {
            let a = args(dir.path(), &[host], &[]);
            assert!(certs(&a).is_err(), "{host:?}");
            assert!(!a.out.exists(), "{host:?}");
            assert!(!dir.path().join("ca").exists(), "{host:?}");
        }
        assert!(dns_name("localhost") && dns_name("board-1.lab.example"));
    }
}
