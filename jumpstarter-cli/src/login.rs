//! `jmp login`: get a token from an external OIDC issuer (or take one given) and save it,
//! with its refresh token, into a client or exporter config, creating the config when needed.
//!
//! Flows, as upstream: `--token` (stored as is; with `--connector-id`, exchanged at the
//! issuer first, Dex style), `--username/--password` (password grant), otherwise the
//! authorization-code flow with PKCE and a loopback callback (`--callback-port`,
//! `JMP_OIDC_CALLBACK_PORT`). `jmp login [client@]host[:port]` first reads the controller's
//! endpoint, namespace, CA and issuer from `https://host[:port]/v1/auth/config`.

use std::{path::PathBuf, time::Duration};

use anyhow::{Context, Result, anyhow, bail};
use clap::Args;
use jumpstarter_core::{
    config::{ClientConfig, ExporterConfig, UserConfig, encode_ca, exporter_config_path},
    oidc::{self, HttpsClient, TokenResponse},
};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The OIDC client id used when none is given.
pub const DEFAULT_CLIENT_ID: &str = "jumpstarter-cli";
/// How long the browser flow waits for the callback.
const CALLBACK_TIMEOUT: Duration = Duration::from_secs(300);

/// Login into a jumpstarter instance.
///
/// Supports simplified login format: jmp login [client-name@]login.endpoint.com
///
/// When using simplified format: the part before @ becomes the client name (--name and
/// --client); the endpoint fetches configuration from the login service's /v1/auth/config
/// API (gRPC endpoint, OIDC issuer, CA certificate, default namespace).
#[derive(Args, Debug, Default)]
pub struct LoginArgs {
    /// [client-name@]login.endpoint: read endpoint, namespace, CA and OIDC issuer from the
    /// login service's /v1/auth/config; the client name becomes --name and --client.
    #[arg(value_name = "LOGIN_TARGET")]
    pub login_target: Option<String>,
    /// Enter the Jumpstarter service endpoint.
    #[arg(short = 'e', long, value_name = "TEXT")]
    pub endpoint: Option<String>,
    /// Enter the Jumpstarter exporter namespace.
    #[arg(long, value_name = "TEXT")]
    pub namespace: Option<String>,
    /// Enter the Jumpstarter exporter name.
    #[arg(long, value_name = "TEXT")]
    pub name: Option<String>,
    /// OIDC issuer
    #[arg(long, value_name = "TEXT")]
    pub issuer: Option<String>,
    /// OIDC client id [default: jumpstarter-cli]
    #[arg(long, value_name = "TEXT")]
    pub client_id: Option<String>,
    /// OIDC access token
    #[arg(long, value_name = "TEXT")]
    pub token: Option<String>,
    /// OIDC username
    #[arg(long, value_name = "TEXT")]
    pub username: Option<String>,
    /// OIDC password
    #[arg(long, value_name = "TEXT")]
    pub password: Option<String>,
    /// OIDC token exchange connector id (Dex specific)
    #[arg(long, value_name = "TEXT")]
    pub connector_id: Option<String>,
    /// Port for OIDC callback server (0=random port)
    #[arg(long, value_name = "INTEGER RANGE", env = "JMP_OIDC_CALLBACK_PORT")]
    pub callback_port: Option<u16>,
    /// Request offline_access scope (refresh token) [default]
    #[arg(long, overrides_with = "no_offline_access")]
    pub offline_access: bool,
    /// Do not request offline_access (no refresh token)
    #[arg(long, overrides_with = "offline_access")]
    pub no_offline_access: bool,
    /// Use OAuth 2.0 Device Authorization Grant (RFC 8628) instead of authorization code
    /// flow. Useful in headless or containerized environments where localhost callbacks are
    /// not available. Also when JMP_OIDC_DEVICE_FLOW=1.
    #[arg(long)]
    pub device_flow: bool,
    /// A comma-separated list of driver client packages to load.
    #[arg(long, value_name = "TEXT")]
    pub allow: Option<String>,
    /// Should all driver client packages be allowed to load (UNSAFE!).
    #[arg(long = "unsafe")]
    pub allow_unsafe: bool,
    /// Disable TLS certificate verification for connections
    #[arg(short = 'k', long)]
    pub insecure_tls: bool,
    /// Disable interactive prompts (for use in scripts).
    #[arg(long)]
    pub nointeractive: bool,
    /// Path of exporter config
    #[arg(long, value_name = "PATH", conflicts_with_all = ["exporter", "client_config", "client"])]
    pub exporter_config: Option<PathBuf>,
    /// Alias of exporter config
    #[arg(long, value_name = "TEXT", conflicts_with_all = ["client_config", "client"])]
    pub exporter: Option<String>,
    /// Path to client config
    #[arg(long, value_name = "PATH", conflicts_with = "client")]
    pub client_config: Option<PathBuf>,
    /// Alias of client config
    #[arg(long, value_name = "TEXT")]
    pub client: Option<String>,
}

/// What the login service's `/v1/auth/config` says.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct LoginServiceConfig {
    /// `grpcEndpoint`.
    pub grpc_endpoint: Option<String>,
    /// `namespace`.
    pub namespace: Option<String>,
    /// `caBundle` (PEM).
    pub ca_bundle: Option<String>,
    /// `oidc[0].issuer`.
    pub issuer: Option<String>,
    /// `oidc[0].clientId`.
    pub client_id: Option<String>,
}

impl LoginServiceConfig {
    /// Reads the JSON document.
    pub fn from_json(doc: &Value) -> Self {
        let s = |v: Option<&Value>| {
            v.and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        let first = doc
            .get("oidc")
            .and_then(Value::as_array)
            .and_then(|a| a.first());
        Self {
            grpc_endpoint: s(doc.get("grpcEndpoint")),
            namespace: s(doc.get("namespace")),
            ca_bundle: s(doc.get("caBundle")),
            issuer: s(first.and_then(|o| o.get("issuer"))),
            client_id: s(first.and_then(|o| o.get("clientId"))),
        }
    }
}

/// Splits `[client@]host` into its parts.
fn split_target(target: &str) -> Result<(Option<String>, String)> {
    let (client, host) = match target.split_once('@') {
        Some((c, h)) => (
            Some(c.trim().to_owned()).filter(|c| !c.is_empty()),
            h.trim(),
        ),
        None => (None, target.trim()),
    };
    if host.is_empty() {
        bail!("login target {target:?} has no endpoint (expected [client-name@]login.endpoint)");
    }
    Ok((client, host.to_owned()))
}

async fn fetch_login_config(host: &str, insecure: bool) -> Result<LoginServiceConfig> {
    let base = if host.starts_with("https://") || host.starts_with("http://") {
        host.trim_end_matches('/').to_owned()
    } else {
        format!("https://{}", host.trim_end_matches('/'))
    };
    let url = format!("{base}/v1/auth/config");
    let http = HttpsClient::new(None, insecure)?;
    let doc = http
        .get_json(&url)
        .await
        .with_context(|| format!("cannot read the login configuration from {url}"))?;
    Ok(LoginServiceConfig::from_json(&doc))
}

/// The config `jmp login` writes into.
enum Target {
    Client(PathBuf, Box<ClientConfig>, bool),
    Exporter(PathBuf, Box<ExporterConfig>),
}

fn new_exporter_config(path: &std::path::Path) -> Result<ExporterConfig> {
    Ok(ExporterConfig::parse(
        "apiVersion: jumpstarter.dev/v1alpha1\nkind: ExporterConfig\nmetadata: {}\nexport: {}\n",
        path,
    )?)
}

/// Where to save: the chosen exporter or client config (loaded when it exists).
fn target(a: &LoginArgs, target_client: Option<&str>) -> Result<Target> {
    if a.exporter_config.is_some() || a.exporter.is_some() {
        let path = match (&a.exporter_config, &a.exporter) {
            (Some(p), _) => p.clone(),
            (None, Some(alias)) => exporter_config_path(alias)?,
            (None, None) => unreachable_target()?,
        };
        let cfg = if path.exists() {
            ExporterConfig::load(&path)?
        } else {
            new_exporter_config(&path)?
        };
        return Ok(Target::Exporter(path, Box::new(cfg)));
    }
    let alias = a.client.as_deref().or(target_client).or(a.name.as_deref());
    let path = match (&a.client_config, alias) {
        (Some(p), _) => p.clone(),
        (None, Some(alias)) => ClientConfig::path_for(alias)?,
        (None, None) => {
            let user = UserConfig::load_or_default(&UserConfig::default_path())?;
            match user.config.current_client {
                Some(alias) => ClientConfig::path_for(&alias)?,
                None => bail!(
                    "which client config? pass --client ALIAS, --client-config PATH or --name NAME \
                     (or --exporter/--exporter-config for an exporter)"
                ),
            }
        }
    };
    if path.exists() {
        let cfg = ClientConfig::load(&path)?;
        Ok(Target::Client(path, Box::new(cfg), false))
    } else {
        Ok(Target::Client(path, Box::default(), true))
    }
}

fn unreachable_target() -> Result<PathBuf> {
    Err(anyhow!("pass --exporter ALIAS or --exporter-config PATH"))
}

/// Runs `jmp login`.
pub async fn run(a: LoginArgs) -> Result<i32> {
    let mut service = LoginServiceConfig::default();
    let mut target_client = None;
    if let Some(t) = &a.login_target {
        let (client, host) = split_target(t)?;
        service = fetch_login_config(&host, a.insecure_tls).await?;
        target_client = client;
    }
    let mut target = target(&a, target_client.as_deref())?;
    let name = a.name.clone().or(target_client.clone());
    let endpoint = a.endpoint.clone().or(service.grpc_endpoint.clone());
    let namespace = a.namespace.clone().or(service.namespace.clone());
    let ca = service.ca_bundle.as_deref().map(encode_ca);
    // Fill in what was given; keep the rest of an existing config.
    let (meta, cfg_endpoint, tls, old_token) = match &mut target {
        Target::Client(_, c, _) => (
            &mut c.metadata,
            &mut c.endpoint,
            &mut c.tls,
            c.token.clone(),
        ),
        Target::Exporter(_, e) => (
            &mut e.metadata,
            &mut e.endpoint,
            &mut e.tls,
            e.token.clone(),
        ),
    };
    if let Some(n) = name {
        meta.name = n;
    }
    if let Some(ns) = namespace {
        meta.namespace = Some(ns);
    }
    if let Some(e) = endpoint {
        *cfg_endpoint = Some(e);
    }
    if let Some(ca) = ca {
        tls.ca = ca;
    }
    if a.insecure_tls {
        tls.insecure = true;
    }
    let mut missing = Vec::new();
    if cfg_endpoint.as_deref().is_none_or(str::is_empty) {
        missing.push("--endpoint");
    }
    if meta.namespace.as_deref().is_none_or(str::is_empty) {
        missing.push("--namespace");
    }
    if meta.name.is_empty() {
        missing.push("--name");
    }
    if !missing.is_empty() {
        bail!(
            "the config needs {} (or log in through a login service: jmp login [client@]host)",
            missing.join(", ")
        );
    }
    let ca_pem = jumpstarter_core::config::decode_ca(tls, None)?;
    let tls_insecure = tls.insecure;
    if let Target::Client(_, c, _) = &mut target {
        if let Some(allow) = &a.allow {
            c.drivers.allow = allow
                .split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect();
        }
        if a.allow_unsafe {
            c.drivers.allow_unsafe = true;
        }
    }

    let tokens = obtain_tokens(
        &a,
        service.issuer.as_deref(),
        service.client_id.as_deref(),
        old_token.as_deref(),
        ca_pem.as_deref(),
        tls_insecure,
    )
    .await?;

    let path = match target {
        Target::Client(path, mut c, created) => {
            c.token = Some(tokens.access_token);
            c.refresh_token = tokens.refresh_token;
            c.save(&path)?;
            if created {
                let user_path = UserConfig::default_path();
                let mut user = UserConfig::load_or_default(&user_path)?;
                if user.config.current_client.is_none() {
                    user.config.current_client = c_alias(&path);
                    user.save(&user_path)?;
                }
            }
            path
        }
        Target::Exporter(path, mut e) => {
            e.token = Some(tokens.access_token);
            jumpstarter_core::config::write_private(&path, e.to_yaml()?.as_bytes())?;
            path
        }
    };
    eprintln!("Login successful; token saved to {}", path.display());
    Ok(0)
}

fn c_alias(path: &std::path::Path) -> Option<String> {
    path.file_stem().map(|s| s.to_string_lossy().into_owned())
}

/// The issuer to use: the flag, the login service's, or the `iss` of the current token
/// (unless it is a controller-issued token).
fn pick_issuer(
    flag: Option<&str>,
    service: Option<&str>,
    old_token: Option<&str>,
) -> Option<String> {
    flag.or(service).map(str::to_owned).or_else(|| {
        old_token
            .and_then(oidc::token_issuer)
            .filter(|iss| iss != jumpstarter_core::auth::DEFAULT_ISSUER)
    })
}

async fn obtain_tokens(
    a: &LoginArgs,
    service_issuer: Option<&str>,
    service_client_id: Option<&str>,
    old_token: Option<&str>,
    ca_pem: Option<&str>,
    insecure: bool,
) -> Result<TokenResponse> {
    if let (Some(token), None) = (&a.token, &a.connector_id) {
        return Ok(TokenResponse {
            access_token: token.clone(),
            id_token: None,
            refresh_token: None,
        });
    }
    let issuer = pick_issuer(a.issuer.as_deref(), service_issuer, old_token).ok_or_else(|| {
        anyhow!("no OIDC issuer: pass --issuer URL (or --token TOKEN to store a token as is)")
    })?;
    let client_id = a
        .client_id
        .as_deref()
        .or(service_client_id)
        .unwrap_or(DEFAULT_CLIENT_ID);
    let http = HttpsClient::new(ca_pem, insecure)?;
    let discovery = oidc::discover(&http, &issuer)
        .await
        .with_context(|| format!("cannot discover the OIDC issuer {issuer}"))?;
    let mut scope = "openid profile".to_owned();
    if !a.no_offline_access {
        scope.push_str(" offline_access");
    }
    let ep = &discovery.token_endpoint;
    let tokens = if let (Some(token), Some(connector)) = (&a.token, &a.connector_id) {
        oidc::token_exchange_grant(&http, ep, client_id, token, connector, &scope).await?
    } else if let Some(username) = &a.username {
        let password = a
            .password
            .as_deref()
            .ok_or_else(|| anyhow!("--username needs --password"))?;
        oidc::password_grant(&http, ep, client_id, username, password, &scope).await?
    } else if a.password.is_some() {
        bail!("--password needs --username");
    } else if use_device_flow(a.device_flow) {
        device_flow(&http, &discovery, client_id, &scope).await?
    } else {
        browser_flow(a, &http, &discovery, client_id, &scope).await?
    };
    Ok(tokens)
}

/// `--device-flow`, or `JMP_OIDC_DEVICE_FLOW=1` (exactly, as upstream main).
fn use_device_flow(flag: bool) -> bool {
    flag || std::env::var("JMP_OIDC_DEVICE_FLOW").is_ok_and(|v| v == "1")
}

/// The device authorization grant (RFC 8628), as upstream main: a device code from the
/// issuer, its URL and user code printed, the token endpoint polled every `interval` seconds
/// (5 more after each `slow_down`) until the user approves, denies, or the code expires.
async fn device_flow(
    http: &HttpsClient,
    discovery: &oidc::Discovery,
    client_id: &str,
    scope: &str,
) -> Result<TokenResponse> {
    let endpoint = discovery
        .device_authorization_endpoint
        .as_deref()
        .ok_or_else(|| {
            anyhow!(
                "The identity provider does not support Device Authorization Grant (RFC 8628). \
             The OIDC discovery document of {} does not include a \
             'device_authorization_endpoint'. Contact your IdP administrator to enable device \
             flow, or use a different login method.",
                discovery.issuer
            )
        })?;
    let device = oidc::device_authorization(http, endpoint, client_id, scope)
        .await
        .context("Device authorization request failed")?;
    match (&device.verification_uri_complete, &device.verification_uri) {
        (Some(uri), _) => {
            println!("To sign in, open the following URL in your browser:\n\n  {uri}\n")
        }
        (None, Some(uri)) => println!(
            "To sign in, open the following URL in your browser:\n\n  {uri}\n\n\
             Then enter the code: {}\n",
            device.user_code.as_deref().unwrap_or_default()
        ),
        (None, None) => {}
    }
    // On stdout, as upstream main prints them (errors stay one line on stderr).
    println!("Waiting for authentication...");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(device.expires_in);
    let mut interval = Duration::from_secs(device.interval);
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(interval).await;
        let poll = oidc::device_token_poll(
            http,
            &discovery.token_endpoint,
            client_id,
            &device.device_code,
        )
        .await;
        match poll {
            Ok(oidc::DevicePoll::Tokens(tokens)) => return Ok(tokens),
            Ok(oidc::DevicePoll::Pending) => {}
            Ok(oidc::DevicePoll::SlowDown) => interval += Duration::from_secs(5),
            Err(oidc::OidcError::Grant { error, .. }) if error == "expired_token" => {
                bail!("Device authorization has expired. Please try again.")
            }
            Err(oidc::OidcError::Grant { error, .. }) if error == "access_denied" => {
                bail!("Authorization request was denied by the user.")
            }
            Err(oidc::OidcError::Grant {
                error, description, ..
            }) => bail!(
                "Device authorization failed: {error}{}",
                description.map(|d| format!(" - {d}")).unwrap_or_default()
            ),
            Err(e) => return Err(anyhow::Error::new(e).context("Device authorization failed")),
        }
    }
    bail!("Device authorization timed out waiting for user approval. Please try again.")
}

/// The authorization-code flow: a loopback callback server, the URL printed (and opened in a
/// browser when interactive), the code exchanged with its PKCE verifier.
async fn browser_flow(
    a: &LoginArgs,
    http: &HttpsClient,
    discovery: &oidc::Discovery,
    client_id: &str,
    scope: &str,
) -> Result<TokenResponse> {
    let authorize = discovery.authorization_endpoint.as_deref().ok_or_else(|| {
        anyhow!(
            "the issuer {} offers no authorization endpoint; use --username/--password or --token",
            discovery.issuer
        )
    })?;
    let port = a.callback_port.unwrap_or(0);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .with_context(|| format!("cannot listen for the OIDC callback on 127.0.0.1:{port}"))?;
    let port = listener.local_addr()?.port();
    let redirect_uri = format!("http://localhost:{port}/callback");
    let (verifier, challenge) = oidc::pkce_pair()?;
    let state = oidc::random_state()?;
    let mut query = vec![
        ("response_type", "code"),
        ("client_id", client_id),
        ("redirect_uri", redirect_uri.as_str()),
        ("scope", scope),
        ("state", state.as_str()),
        ("code_challenge", challenge.as_str()),
        ("code_challenge_method", "S256"),
    ];
    if let Some(c) = &a.connector_id {
        query.push(("connector_id", c));
    }
    let sep = if authorize.contains('?') { '&' } else { '?' };
    let url = format!("{authorize}{sep}{}", oidc::form_encode(&query));
    eprintln!("Open this URL in a browser to log in:\n{url}");
    if !a.nointeractive {
        open_browser(&url);
    }
    let code = tokio::time::timeout(CALLBACK_TIMEOUT, wait_for_code(&listener, &state))
        .await
        .map_err(|_| anyhow!("no login within {} s", CALLBACK_TIMEOUT.as_secs()))??;
    Ok(oidc::code_grant(
        http,
        &discovery.token_endpoint,
        client_id,
        &code,
        &redirect_uri,
        &verifier,
    )
    .await?)
}

fn open_browser(url: &str) {
    let opener = if cfg!(target_os = "macos") {
        "open"
    } else if std::env::var_os("DISPLAY").is_some() || std::env::var_os("WAYLAND_DISPLAY").is_some()
    {
        "xdg-open"
    } else {
        return;
    };
    let _ = std::process::Command::new(opener)
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
}

/// Serves the callback until a request with our `state` arrives; returns its `code`.
async fn wait_for_code(listener: &tokio::net::TcpListener, state: &str) -> Result<String> {
    loop {
        let (mut conn, _) = listener.accept().await?;
        let mut buf = Vec::with_capacity(1024);
        let mut chunk = [0u8; 1024];
        let complete = loop {
            if buf.windows(4).any(|w| w == b"\r\n\r\n") {
                break true;
            }
            if buf.len() > 16 * 1024 {
                break false;
            }
            match tokio::time::timeout(Duration::from_secs(10), conn.read(&mut chunk)).await {
                Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                _ => break false,
            }
        };
        if !complete {
            continue;
        }
        let head = String::from_utf8_lossy(&buf).into_owned();
        let target = head
            .lines()
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .unwrap_or("");
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        if path != "/callback" {
            let _ = reply(&mut conn, "404 Not Found", "not found").await;
            continue;
        }
        let params = oidc::form_decode(query);
        let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        if get("state").as_deref() != Some(state) {
            let _ = reply(&mut conn, "400 Bad Request", "unexpected state; try again").await;
            continue;
        }
        if let Some(err) = get("error") {
            let _ = reply(&mut conn, "400 Bad Request", "login failed").await;
            let desc = get("error_description")
                .map(|d| format!(": {d}"))
                .unwrap_or_default();
            bail!("the issuer refused the login: {err}{desc}");
        }
        let Some(code) = get("code") else {
            let _ = reply(&mut conn, "400 Bad Request", "no code").await;
            bail!("the OIDC callback carried no code");
        };
        let _ = reply(
            &mut conn,
            "200 OK",
            "Login complete; you can close this window and return to jmp.",
        )
        .await;
        return Ok(code);
    }
}

async fn reply(conn: &mut tokio::net::TcpStream, status: &str, body: &str) -> std::io::Result<()> {
    let text = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(text.as_bytes()).await?;
    conn.shutdown().await
}

/// `jmp auth refresh`: the refresh-token grant at the issuer of the current token; saves
/// the new token (and the new refresh token, when the issuer rotates it).
pub async fn refresh(cfg: ClientConfig) -> Result<String> {
    let where_ = cfg
        .path
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "the client config".into());
    let path = cfg.path.clone().context(
        "this client config comes from JMP_* variables, not a file; refresh a saved config with \
         --client ALIAS",
    )?;
    let Some(refresh_token) = cfg.refresh_token.clone().filter(|t| !t.is_empty()) else {
        bail!(
            "no refresh token stored in {where_}: log in again with `jmp login`, or get a new \
             controller token with `jmp auth rotate`"
        );
    };
    let issuer = cfg
        .token
        .as_deref()
        .and_then(oidc::token_issuer)
        .ok_or_else(|| {
            anyhow!("the token in {where_} names no issuer (iss); log in again with `jmp login`")
        })?;
    let ca = cfg.ca_pem()?;
    let http = HttpsClient::new(ca.as_deref(), cfg.tls.insecure)?;
    let discovery = oidc::discover(&http, &issuer)
        .await
        .with_context(|| format!("cannot discover the OIDC issuer {issuer}"))?;
    let tokens = oidc::refresh_grant(
        &http,
        &discovery.token_endpoint,
        DEFAULT_CLIENT_ID,
        &refresh_token,
    )
    .await
    .context("cannot refresh the token")?;
    let mut new = cfg;
    new.token = Some(tokens.access_token);
    if let Some(rt) = tokens.refresh_token {
        new.refresh_token = Some(rt);
    }
    new.save(&path)?;
    Ok(path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_split() {
        assert_eq!(
            split_target("alice@login.example.com").unwrap(),
            (Some("alice".into()), "login.example.com".into())
        );
        assert_eq!(
            split_target("login.example.com:8086").unwrap(),
            (None, "login.example.com:8086".into())
        );
        assert!(split_target("alice@").is_err());
        assert!(split_target("").is_err());
    }

    #[test]
    fn login_service_document() {
        let doc = serde_json::json!({
            "grpcEndpoint": "ctl:443", "namespace": "lab", "caBundle": "",
            "oidc": [{"issuer": "https://dex", "clientId": "cli"}],
        });
        let c = LoginServiceConfig::from_json(&doc);
        assert_eq!(c.grpc_endpoint.as_deref(), Some("ctl:443"));
        assert_eq!(c.namespace.as_deref(), Some("lab"));
        assert_eq!(c.ca_bundle, None);
        assert_eq!(c.issuer.as_deref(), Some("https://dex"));
        assert_eq!(c.client_id.as_deref(), Some("cli"));
        assert_eq!(
            LoginServiceConfig::from_json(&serde_json::json!([])),
            LoginServiceConfig::default()
        );
    }

    #[test]
    fn issuer_falls_back_to_the_current_tokens() {
        use base64::Engine;
        let b = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let ext = format!("{}.{}.x", b("{}"), b(r#"{"iss":"https://dex"}"#));
        let int = format!("{}.{}.x", b("{}"), b(r#"{"iss":"https://localhost:8085"}"#));
        assert_eq!(
            pick_issuer(Some("https://f"), Some("https://s"), Some(&ext)).as_deref(),
            Some("https://f")
        );
        assert_eq!(
            pick_issuer(None, Some("https://s"), Some(&ext)).as_deref(),
            Some("https://s")
        );
        assert_eq!(
            pick_issuer(None, None, Some(&ext)).as_deref(),
            Some("https://dex")
        );
        assert_eq!(pick_issuer(None, None, Some(&int)), None);
        assert_eq!(pick_issuer(None, None, None), None);
    }
}
