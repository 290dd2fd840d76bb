//! `cargo xtask kube-e2e`, step "ServiceAccount tokens": clients authenticate with
//! Kubernetes ServiceAccount tokens (`kubectl create token`) through the external-issuer
//! (OIDC) path of docs/authentication.md, the API server being the issuer.
//!
//! `kube-up` starts the API server with `--service-account-issuer=https://127.0.0.1:PORT`
//! and binds `system:service-account-issuer-discovery` to `system:unauthenticated`, so the
//! issuer's discovery document and keys are readable without credentials, as the
//! controller's authenticator reads them. This step:
//! 1. writes the `jumpstarter-controller` ConfigMap of namespace [`NAMESPACE`] with a
//!    `config.authentication.jwt` entry for that issuer (audience `jumpstarter-cli`, the
//!    cluster's CA, username = `k8s:` + `sub`), exactly as for the upstream controller;
//! 2. starts `jumpstarter-controller --store kubernetes --namespace jumpstarter-oidc` as the
//!    controller's ServiceAccount, an exporter (`jmp run`, controller token) and a Client
//!    object whose `spec.username` is the ServiceAccount's username;
//! 3. runs `jmp shell -l board=... -- j power on` with a client config holding a token from
//!    `kubectl create token ci-bot --audience jumpstarter-cli`: the lease is granted to the
//!    Client the token maps to;
//! 4. checks that a token for another audience, and an expired token of the same issuer (the
//!    good token with `exp` in the past, signed again with the cluster's service-account key:
//!    the TokenRequest API issues nothing shorter than 10 minutes), are refused with errors
//!    that say so.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context, Result, bail, ensure};

use crate::{
    kube,
    procs::{self, Background},
};

/// The namespace of the controller of this step (its own ConfigMap, key Secret and leader
/// Lease, apart from the other steps' controller in `jumpstarter`).
pub const NAMESPACE: &str = "jumpstarter-oidc";
/// The ServiceAccount the client authenticates as (namespace `default`).
const SERVICE_ACCOUNT: &str = "ci-bot";
/// The audience the controller accepts.
const AUDIENCE: &str = "jumpstarter-cli";
/// The exporter of this step (namespace `default`).
const EXPORTER: &str = "oidc-board";

/// The Client object a ServiceAccount's token acts as: the username `k8s:` + `sub`
/// (`system:serviceaccount:NS:NAME`) made a name as docs/authentication.md says (everything
/// up to the first `:` dropped, other characters outside `[-a-z0-9]` made `-`).
pub fn client_name(namespace: &str, account: &str) -> String {
    format!("system-serviceaccount-{namespace}-{account}")
}

fn username(namespace: &str, account: &str) -> String {
    format!("k8s:system:serviceaccount:{namespace}:{account}")
}

/// The `config` key of the ConfigMap: the API server as an external JWT issuer.
fn controller_config(issuer: &str, ca_pem: &str) -> String {
    let ca: String = ca_pem
        .lines()
        .map(|l| format!("            {l}\n"))
        .collect();
    format!(
        "authentication:\n  jwt:\n    - issuer:\n        url: {issuer}\n        audiences: \
         [{AUDIENCE}]\n        certificateAuthority: |\n{ca}      claimMappings:\n        \
         username:\n          claim: sub\n          prefix: \"k8s:\"\n"
    )
}

/// Runs the step against the running `kube-up` cluster.
pub fn run() -> Result<()> {
    let issuer = kube::issuer()?;
    kube::allow_issuer_discovery()?;
    let ca = std::fs::read_to_string(kube::state_dir().join("ca.crt"))?;
    let discovery = kube::anonymous_get(&format!("{issuer}/.well-known/openid-configuration"))?;
    ensure!(
        discovery.contains(&format!("\"issuer\":\"{issuer}\"")),
        "the API server's discovery document (read without credentials) does not name the \
         issuer {issuer}: {discovery}"
    );
    println!("   issuer {issuer}: discovery readable without credentials");

    let client = client_name("default", SERVICE_ACCOUNT);
    // What an earlier run left: the exporter, the client and their Secrets, their leases.
    kube::kubectl(&[
        "delete",
        "-n",
        "default",
        "--ignore-not-found",
        "--wait=false",
        &format!("exporters.jumpstarter.dev/{EXPORTER}"),
        &format!("secrets/{EXPORTER}-exporter"),
        &format!("clients.jumpstarter.dev/{client}"),
    ])?;
    let manifests = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NAMESPACE}\n---\n\
         apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: {SERVICE_ACCOUNT}\n  \
         namespace: default\n---\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: jumpstarter-controller\n  \
         namespace: {NAMESPACE}\ndata:\n  config: |\n{}---\n\
         apiVersion: jumpstarter.dev/v1alpha1\nkind: Client\nmetadata:\n  name: {client}\n  \
         namespace: default\nspec:\n  username: \"{}\"\n",
        controller_config(&issuer, &ca)
            .lines()
            .map(|l| format!("    {l}\n"))
            .collect::<String>(),
        username("default", SERVICE_ACCOUNT)
    );
    kube::kubectl_input(
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=jumpstarter-xtask",
            "-f",
            "-",
        ],
        Some(&manifests),
    )?;

    let work = crate::interop::tempfile_dir::Dir::new("jmp-kube-oidc")?;
    let bin = crate::target_dir().join("debug");
    let admin = work.path().join("admin.yaml");
    let mut c = Command::new(bin.join("jumpstarter-controller"));
    c.args(["--store", "kubernetes", "--namespace", NAMESPACE])
        .args(["--listen", "127.0.0.1:0", "--router-listen", "127.0.0.1:0"])
        .args(["--metrics-listen", "off"])
        .arg("--data-dir")
        .arg(work.path().join("data"))
        .arg("--admin-config")
        .arg(&admin)
        .env("KUBECONFIG", kube::controller_kubeconfig())
        .env("RUST_LOG", "info");
    let mut controller = Background::start("jumpstarter-controller (oidc)", c)?;
    controller.wait_for_line("jumpstarter-controller ready:", Duration::from_secs(60))?;

    let jmp = |args: &[&str]| {
        let mut c = Command::new(bin.join("jmp"));
        c.args(args)
            .env("JMP_ADMIN_CONFIG", &admin)
            .env("JMP_CLIENT_CONFIG_HOME", work.path().join("config"))
            .env("PATH", path_with(&bin))
            .env_remove("JMP_NAME")
            .env_remove("JUMPSTARTER_HOST");
        c
    };
    let exporter_config = work.path().join("exporter.yaml");
    let exporter_config_s = exporter_config.to_string_lossy().into_owned();
    let out = procs::run(
        jmp(&[
            "admin",
            "create",
            "exporter",
            EXPORTER,
            "-l",
            "board=oidc",
            "--nointeractive",
            "--out",
            &exporter_config_s,
        ]),
        Duration::from_secs(60),
    )?;
    ensure!(
        out.code == 0,
        "jmp admin create exporter: {}{}",
        out.stdout,
        out.stderr
    );
    let text = std::fs::read_to_string(&exporter_config)?;
    std::fs::write(
        &exporter_config,
        text.replace(
            "\nexport:\n",
            "\nexport:\n  power:\n    type: jumpstarter_driver_power.driver.MockPower\n",
        ),
    )?;
    let mut exporter = Background::start(
        "jmp run (oidc)",
        jmp(&["run", "--exporter-config", &exporter_config_s]),
    )?;
    exporter.wait_for_line("registered with controller", Duration::from_secs(60))?;

    // The client config a CI job would mount: the endpoint from the admin config, the CA
    // from the key Secret (base64, as `tls.ca` wants it; docs/kubernetes.md section 4), the
    // ServiceAccount's token.
    let admin_text = std::fs::read_to_string(&admin)?;
    let endpoint = admin_text
        .lines()
        .find_map(|l| l.trim().strip_prefix("endpoint:"))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .with_context(|| format!("no endpoint in the admin config {}", admin.display()))?;
    let ca_b64 = kube::kubectl(&[
        "get",
        "secret",
        "jumpstarter-controller-keys",
        "-n",
        NAMESPACE,
        "-o",
        "jsonpath={.data.ca\\.crt}",
    ])?
    .trim()
    .to_owned();
    ensure!(
        !ca_b64.is_empty(),
        "the key Secret of {NAMESPACE} has no ca.crt"
    );
    let client_config = |token: &str, file: &str| -> Result<String> {
        let path = work.path().join(file);
        std::fs::write(
            &path,
            format!(
                "apiVersion: jumpstarter.dev/v1alpha1\nkind: ClientConfig\nmetadata:\n  \
                 namespace: default\n  name: {client}\nendpoint: {endpoint}\ntls:\n  ca: \
                 {ca_b64}\n  insecure: false\ntoken: {token}\ndrivers:\n  allow: []\n  \
                 unsafe: true\n"
            ),
        )?;
        Ok(path.to_string_lossy().into_owned())
    };
    let create_token = |audience: &str| -> Result<String> {
        Ok(kube::kubectl(&[
            "create",
            "token",
            SERVICE_ACCOUNT,
            "-n",
            "default",
            "--audience",
            audience,
            "--duration=10m",
        ])?
        .trim()
        .to_owned())
    };

    let token = create_token(AUDIENCE)?;
    let good = client_config(&token, "sa-client.yaml")?;
    let out = procs::run(
        jmp(&[
            "shell",
            "--client-config",
            &good,
            "-l",
            "board=oidc",
            "--",
            "j",
            "power",
            "on",
        ]),
        Duration::from_secs(120),
    )?;
    ensure!(
        out.code == 0,
        "jmp shell with the ServiceAccount token failed:\n{}{}",
        out.stdout,
        out.stderr
    );
    exporter.wait_for_line("power on", Duration::from_secs(30))?;
    let holders = kube::kubectl(&[
        "get",
        "leases.jumpstarter.dev",
        "-n",
        "default",
        "-o",
        "jsonpath={range .items[*]}{.spec.clientRef.name} {.status.exporterRef.name}{\"\\n\"}{end}",
    ])?;
    ensure!(
        holders
            .lines()
            .any(|l| l.trim() == format!("{client} {EXPORTER}")),
        "no lease of {client} on {EXPORTER} in the store:\n{holders}"
    );
    println!(
        "   ServiceAccount token (aud {AUDIENCE}) -> Client {client}: lease granted, j power on"
    );

    let refused = |config: &str, want: &str, what: &str| -> Result<()> {
        let out = procs::run(
            jmp(&["get", "leases", "--client-config", config]),
            Duration::from_secs(60),
        )?;
        ensure!(
            out.code != 0,
            "jmp get leases with {what} succeeded:\n{}",
            out.stdout
        );
        ensure!(
            out.stderr.contains(want),
            "jmp get leases with {what}: the error does not say {want:?}:\n{}",
            out.stderr
        );
        let line = out
            .stderr
            .lines()
            .find(|l| l.contains(want))
            .unwrap_or_default();
        println!("   {what}: refused: {}", line.trim());
        Ok(())
    };
    let other = client_config(&create_token("someone-else")?, "sa-other-audience.yaml")?;
    refused(&other, "audience", "a token for audience someone-else")?;
    let expired = client_config(
        &expire(&token, &kube::state_dir().join("sa.key"))?,
        "sa-expired.yaml",
    )?;
    refused(&expired, "token is expired", "an expired token")?;
    drop(exporter);
    drop(controller);
    kube::kubectl(&[
        "delete",
        "-n",
        "default",
        "--ignore-not-found",
        "--wait=false",
        &format!("exporters.jumpstarter.dev/{EXPORTER}"),
        &format!("secrets/{EXPORTER}-exporter"),
        &format!("clients.jumpstarter.dev/{client}"),
    ])?;
    Ok(())
}

fn path_with(bin: &Path) -> String {
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// `token` with `exp` an hour ago (`iat`, `nbf` before it), signed again (ES256) with the
/// service-account key `key`, under the same header (and so the same key id).
fn expire(token: &str, key: &Path) -> Result<String> {
    let mut parts = token.split('.');
    let (Some(header), Some(payload)) = (parts.next(), parts.next()) else {
        bail!("not a JWT: {token}");
    };
    let mut claims: serde_json::Value = serde_json::from_slice(&b64url_decode(payload)?)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs() as i64;
    for (claim, at) in [
        ("exp", now - 3600),
        ("iat", now - 4200),
        ("nbf", now - 4200),
    ] {
        claims[claim] = at.into();
    }
    let input = format!("{header}.{}", b64url_encode(&serde_json::to_vec(&claims)?));
    let mut child = Command::new("openssl")
        .args(["dgst", "-sha256", "-sign"])
        .arg(key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running openssl dgst")?;
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().context("no stdin")?;
        stdin.write_all(input.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "openssl dgst -sign failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(format!(
        "{input}.{}",
        b64url_encode(&der_to_raw(&out.stdout)?)
    ))
}

/// An ECDSA P-256 signature from DER (`SEQUENCE { r INTEGER, s INTEGER }`, as openssl
/// writes it) to the 64 bytes `r || s` JWS wants.
fn der_to_raw(der: &[u8]) -> Result<Vec<u8>> {
    let bad = || anyhow::anyhow!("unexpected ECDSA signature encoding: {der:02x?}");
    let body = match der {
        [0x30, len, rest @ ..] if usize::from(*len) == rest.len() => rest,
        [0x30, 0x81, len, rest @ ..] if usize::from(*len) == rest.len() => rest,
        _ => return Err(bad()),
    };
    let mut out = Vec::with_capacity(64);
    let mut rest = body;
    for _ in 0..2 {
        let [0x02, len, tail @ ..] = rest else {
            return Err(bad());
        };
        let len = usize::from(*len);
        let int = tail.get(..len).ok_or_else(bad)?;
        let int: Vec<u8> = int.iter().copied().skip_while(|b| *b == 0).collect();
        ensure!(int.len() <= 32, "ECDSA integer longer than 32 bytes");
        out.extend(std::iter::repeat_n(0, 32 - int.len()));
        out.extend(int);
        rest = &tail[len..];
    }
    Ok(out)
}

const B64URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn b64url_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len() * 4 / 3 + 3);
    for chunk in data.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(char::from(B64URL[((n >> (18 - 6 * i)) & 63) as usize]));
        }
    }
    out
}

fn b64url_decode(text: &str) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.trim_end_matches('=').bytes() {
        let v = B64URL
            .iter()
            .position(|x| *x == c)
            .with_context(|| format!("not base64url: {text}"))?;
        acc = (acc << 6) | v as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64url_round_trips() {
        for data in [
            &b""[..],
            b"f",
            b"fo",
            b"foo",
            b"foob",
            b"fooba",
            b"foobar",
            &[0xff, 0xfe],
        ] {
            assert_eq!(b64url_decode(&b64url_encode(data)).unwrap(), data);
        }
        assert_eq!(b64url_encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(b64url_encode(&[0xfb, 0xff]), "-_8");
        assert_eq!(b64url_decode("eyJhIjoxfQ").unwrap(), br#"{"a":1}"#);
    }

    #[test]
    fn der_signatures_become_64_bytes() {
        // r with a leading zero byte (high bit set), s short.
        let mut der = vec![0x30, 0x26, 0x02, 0x21, 0x00];
        der.extend([0x80; 32]);
        der.extend([0x02, 0x01, 0x05]);
        let raw = der_to_raw(&der).unwrap();
        assert_eq!(raw.len(), 64);
        assert_eq!(&raw[..32], &[0x80; 32]);
        assert_eq!(raw[63], 5);
        assert!(raw[32..63].iter().all(|b| *b == 0));
        assert!(der_to_raw(&[0x30, 0x02, 0x05, 0x00]).is_err());
    }

    #[test]
    fn service_account_names_map_to_the_documented_client_name() {
        assert_eq!(
            client_name("default", "ci-bot"),
            "system-serviceaccount-default-ci-bot"
        );
        assert_eq!(
            username("default", "ci-bot"),
            "k8s:system:serviceaccount:default:ci-bot"
        );
    }
}
