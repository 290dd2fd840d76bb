//! Errors that say what to do next: a controller that does not answer, TLS spoken to a
//! plaintext port and the reverse, an exporter certificate the client does not trust or
//! that does not name the host the client connected to.

use jumpstarter_core::{
    client::{TlsMismatch, tls_mismatch::CertName},
    config::ClientConfig,
};

use crate::direct_certs::{CA_PEM, SERVER_CERT, SERVER_KEY};

/// An error, and on a line of its own what to do about it; the error stays the cause.
#[derive(Debug, thiserror::Error)]
#[error("{}\n{hint}", jumpstarter_core::error_chain(&**source))]
struct WithHint {
    #[source]
    source: jumpstarter_core::BoxError,
    hint: String,
}

impl WithHint {
    fn wrap(error: anyhow::Error, hint: String) -> anyhow::Error {
        anyhow::Error::new(Self {
            source: error.into(),
            hint,
        })
    }
}

/// Whether an error's text says nothing listens there (refused, unreachable, unknown host,
/// timed out).
fn is_unreachable(text: &str) -> bool {
    [
        "Connection refused",
        "connection refused",
        "No route to host",
        "timed out",
        "dns error",
        "failed to lookup address",
        "Name or service not known",
        "Network is unreachable",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

/// Whether a TLS client met a server that answered in plaintext (rustls sees an HTTP/2
/// frame where a TLS record should be).
fn is_plaintext_answer(text: &str) -> bool {
    text.contains("InvalidContentType") || text.contains("corrupt message")
}

/// Whether a plaintext HTTP/2 client met a TLS server (which closes the connection at the
/// HTTP/2 preface, or answers with a TLS alert that reads as a broken frame).
fn is_tls_answer(text: &str) -> bool {
    [
        "connection reset",
        "Connection reset",
        "broken pipe",
        "Broken pipe",
        "frame with invalid size",
        "invalid HTTP version",
        "connection closed before message completed",
        "unexpected end of file",
        "UnexpectedEof",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

/// Where a client config came from, for messages.
fn config_source(cfg: &ClientConfig) -> String {
    match &cfg.path {
        Some(p) => p.display().to_string(),
        None => "the JMP_* environment variables (JMP_ENDPOINT)".into(),
    }
}

/// Adds what to do next to an error reaching the controller of `cfg`: the endpoint, the
/// config it came from, and what to check. Other errors are returned as they are.
pub fn controller_error(cfg: &ClientConfig, error: anyhow::Error) -> anyhow::Error {
    let text = crate::output::format_error(&error);
    let endpoint = cfg.endpoint.clone().unwrap_or_default();
    let source = config_source(cfg);
    if is_unreachable(&text) {
        anyhow::anyhow!(
            "cannot reach the controller at {endpoint} (the endpoint in {source}): {text}\n\
             Is it running? Start one with `jumpstarter-controller`, or check the endpoint \
             (`jmp config client create ALIAS --endpoint HOST:PORT ...` writes a config with \
             another)."
        )
    } else if is_plaintext_answer(&text) {
        anyhow::anyhow!(
            "the controller at {endpoint} (from {source}) answered in plaintext, but clients \
             speak TLS to it: is {endpoint} the controller's gRPC port (`--listen`), not \
             another service? ({text})"
        )
    } else {
        error
    }
}

/// Adds which side speaks plaintext to an error reaching an exporter directly
/// (`jmp shell --tls-grpc ADDR`); `insecure` is whether we spoke plaintext.
pub fn direct_error(addr: &str, insecure: bool, error: anyhow::Error) -> anyhow::Error {
    let text = crate::output::format_error(&error);
    let mismatch = error.chain().find_map(|e| e.downcast_ref::<TlsMismatch>());
    if !insecure
        && (matches!(mismatch, Some(TlsMismatch::Plaintext(_))) || is_plaintext_answer(&text))
    {
        anyhow::anyhow!(
            "the exporter at {addr} looks plaintext (no TLS: it runs with --tls-grpc-insecure) \
             and we spoke TLS: add --tls-grpc-insecure here too, or give `jmp run` --tls-cert \
             and --tls-key ({text})"
        )
    } else if let Some(TlsMismatch::UntrustedCertificate(_)) = mismatch {
        let hint = format!(
            "Pass the CA certificate that `jmp config direct certs` wrote beside the exporter's \
             {SERVER_CERT}: jmp shell --tls-grpc {addr} --tls-ca {CA_PEM} ..."
        );
        WithHint::wrap(error, hint)
    } else if let Some(TlsMismatch::WrongName {
        name, presented, ..
    }) = mismatch
    {
        let hint = wrong_name_hint(name, presented);
        WithHint::wrap(error, hint)
    } else if insecure
        && (matches!(mismatch, Some(TlsMismatch::SpeaksTls(_))) || is_tls_answer(&text))
    {
        anyhow::anyhow!(
            "the exporter at {addr} closed the connection: it probably speaks TLS (it runs \
             with --tls-cert/--tls-key) and we spoke plaintext (--tls-grpc-insecure): drop \
             --tls-grpc-insecure and trust its CA with --tls-ca PATH ({text})"
        )
    } else if is_unreachable(&text) {
        anyhow::anyhow!(
            "cannot reach an exporter at {addr}: {text}\nIs `jmp run --tls-grpc-listener` \
             running there, on that port?"
        )
    } else {
        error
    }
}

/// What to do when the exporter's certificate does not name `name` (it names `presented`):
/// connect by a name it has, or make one that has `name` too.
fn wrong_name_hint(name: &str, presented: &[CertName]) -> String {
    let mut hosts = Vec::new();
    let mut ips = Vec::new();
    for n in presented {
        match n {
            // A wildcard is no name `jmp config direct certs` makes.
            CertName::Dns(h) if !h.contains('*') => hosts.push(h.clone()),
            CertName::Ip(ip) => ips.push(ip.to_string()),
            _ => {}
        }
    }
    let known: Vec<String> = hosts.iter().chain(&ips).cloned().collect();
    let (list, name_text) = match name.parse::<std::net::IpAddr>() {
        Ok(ip) => (&mut ips, ip.to_string()),
        Err(_) => (&mut hosts, name.to_string()),
    };
    if !list.contains(&name_text) {
        list.push(name_text);
    }
    let mut command = String::from("jmp config direct certs");
    for h in &hosts {
        command.push_str(&format!(" --host {h}"));
    }
    for ip in &ips {
        command.push_str(&format!(" --ip {ip}"));
    }
    command.push_str(" --out . --force");
    let make = if known.is_empty() {
        format!("Make the exporter a certificate for {name}")
    } else {
        format!(
            "Connect by a name it is for ({}), or make the exporter a certificate for {name} too",
            known.join(", ")
        )
    };
    format!(
        "{make}: `{command}` (add --ca-dir DIR if its CA is not the default one), and restart \
         `jmp run` with the new {SERVER_CERT} and {SERVER_KEY}."
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> ClientConfig {
        ClientConfig {
            endpoint: Some("localhost:8082".into()),
            path: Some("/home/u/.config/jumpstarter/clients/hello.yaml".into()),
            ..ClientConfig::default()
        }
    }

    #[test]
    fn a_controller_that_does_not_answer_names_endpoint_config_and_what_to_do() {
        let e = controller_error(
            &cfg(),
            anyhow::anyhow!(
                "cannot connect to localhost:8082: transport error: tcp connect error: \
                 Connection refused (os error 111)"
            ),
        );
        insta::assert_snapshot!(e.to_string(), @r"
        cannot reach the controller at localhost:8082 (the endpoint in /home/u/.config/jumpstarter/clients/hello.yaml): cannot connect to localhost:8082: transport error: tcp connect error: Connection refused (os error 111)
        Is it running? Start one with `jumpstarter-controller`, or check the endpoint (`jmp config client create ALIAS --endpoint HOST:PORT ...` writes a config with another).
        ");
    }

    #[test]
    fn other_errors_pass_unchanged() {
        let e = controller_error(&cfg(), anyhow::anyhow!("Authentication failed: bad token"));
        assert_eq!(e.to_string(), "Authentication failed: bad token");
    }

    #[test]
    fn a_tls_plaintext_mismatch_says_which_side_is_plaintext() {
        let tls_to_plain = direct_error(
            "host:1",
            false,
            anyhow::anyhow!("received corrupt message of type InvalidContentType"),
        );
        assert!(
            tls_to_plain
                .to_string()
                .starts_with("the exporter at host:1 looks plaintext (no TLS"),
            "{tls_to_plain}"
        );
        let plain_to_tls = direct_error(
            "host:1",
            true,
            anyhow::anyhow!("h2 protocol error: connection reset"),
        );
        assert!(
            plain_to_tls.to_string().contains("probably speaks TLS"),
            "{plain_to_tls}"
        );
    }

    #[test]
    fn a_wrong_name_gets_the_command_that_adds_it() {
        let presented = [
            CertName::Dns("localhost".into()),
            CertName::Dns("*.lab".into()),
            CertName::Ip("10.0.0.5".parse().unwrap()),
            CertName::Other("DirectoryName".into()),
        ];
        insta::assert_snapshot!(wrong_name_hint("127.0.0.1", &presented), @"Connect by a name it is for (localhost, 10.0.0.5), or make the exporter a certificate for 127.0.0.1 too: `jmp config direct certs --host localhost --ip 10.0.0.5 --ip 127.0.0.1 --out . --force` (add --ca-dir DIR if its CA is not the default one), and restart `jmp run` with the new server.pem and server-key.pem.");
        insta::assert_snapshot!(wrong_name_hint("board1.lab", &[]), @"Make the exporter a certificate for board1.lab: `jmp config direct certs --host board1.lab --out . --force` (add --ca-dir DIR if its CA is not the default one), and restart `jmp run` with the new server.pem and server-key.pem.");
    }
}
