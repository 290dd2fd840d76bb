//! A fake OIDC issuer on loopback HTTPS, for the external-authentication tests of the
//! controller and of `jmp login`.
//!
//! It serves discovery, a JWKS with one ES256 key generated here, a token endpoint with the
//! password, refresh-token and authorization-code (PKCE S256) grants, and an authorize
//! endpoint that approves at once: it redirects to the callback with a code for
//! [`FakeIssuer::BROWSER_USER`] (whose ID token carries the request's `nonce`), or with an
//! error after [`FakeIssuer::set_authorize_error`]. Its device authorization endpoint (RFC 8628) hands out
//! device codes that play a [`DeviceScript`]: some `authorization_pending` answers (one of
//! them `slow_down`, if asked), then approval for [`FakeIssuer::BROWSER_USER`], denial or
//! expiry.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{SystemTime, UNIX_EPOCH},
};

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use jumpstarter_core::{auth::CertificateAuthority, oidc};
use ring::{
    rand::SystemRandom,
    signature::{self, EcdsaKeyPair, KeyPair},
};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A running fake issuer (stops when dropped).
pub struct FakeIssuer {
    /// `https://127.0.0.1:<port>` (the `iss` of its tokens).
    pub url: String,
    /// PEM of the CA its certificate comes from.
    pub ca_pem: String,
    /// Where the CA PEM is written (for `SSL_CERT_FILE` / `certificateAuthority`).
    pub ca_file: std::path::PathBuf,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

struct Grant {
    user: String,
    client_id: String,
    /// The authorization request's `nonce`, put into the ID token of its code.
    nonce: Option<String>,
}

/// What the device codes handed out from now on answer when polled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceScript {
    /// Polls answered `authorization_pending` first.
    pub pending: u32,
    /// The poll (1-based, among the pending ones) answered `slow_down` instead.
    pub slow_down_at: Option<u32>,
    /// What the poll after the pending ones gets.
    pub outcome: DeviceOutcome,
    /// The `interval` the device authorization response says (seconds).
    pub interval: u64,
}

/// How a device code's approval ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceOutcome {
    /// Tokens for [`FakeIssuer::BROWSER_USER`].
    Approve,
    /// `access_denied`.
    Deny,
    /// `expired_token`.
    Expire,
}

impl Default for DeviceScript {
    fn default() -> Self {
        Self {
            pending: 2,
            slow_down_at: None,
            outcome: DeviceOutcome::Approve,
            interval: 1,
        }
    }
}

/// A device code handed out: its script, client and the times it was polled.
struct Device {
    script: DeviceScript,
    client_id: String,
    polls: Vec<std::time::Instant>,
}

struct State {
    url: String,
    key: EcdsaKeyPair,
    users: HashMap<String, String>,
    codes: Mutex<HashMap<String, (String, String, Grant)>>,
    refresh: Mutex<HashMap<String, Grant>>,
    jwks_fetches: AtomicUsize,
    token_lifetime: i64,
    counter: AtomicUsize,
    device_script: Mutex<DeviceScript>,
    devices: Mutex<HashMap<String, Device>>,
    authorize_error: Mutex<Option<String>>,
    authorize_requests: AtomicUsize,
    nonce_override: Mutex<Option<String>>,
}

/// Seconds since the Unix epoch (the `iat`/`exp` clock of tokens).
pub fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn new_key() -> EcdsaKeyPair {
    let doc = EcdsaKeyPair::generate_pkcs8(
        &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
        &SystemRandom::new(),
    )
    .unwrap();
    EcdsaKeyPair::from_pkcs8(
        &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
        doc.as_ref(),
        &SystemRandom::new(),
    )
    .unwrap()
}

/// Signs `claims` with ES256 under `kid`.
pub fn sign(key: &EcdsaKeyPair, kid: &str, claims: &Value) -> String {
    let h = URL_SAFE_NO_PAD
        .encode(serde_json::to_vec(&json!({"alg": "ES256", "typ": "JWT", "kid": kid})).unwrap());
    let c = URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims).unwrap());
    let input = format!("{h}.{c}");
    let sig = key.sign(&SystemRandom::new(), input.as_bytes()).unwrap();
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
}

impl FakeIssuer {
    /// The user the authorize endpoint logs in.
    pub const BROWSER_USER: &'static str = "carol";
    /// Key id of the issuer's key.
    pub const KID: &'static str = "k1";

    /// Starts an issuer on the current runtime with users `alice`/`alice-pw`,
    /// `bob`/`bob-pw`, `carol`/`carol-pw`, tokens valid for 10 minutes.
    pub async fn start() -> Self {
        Self::start_with_lifetime(600).await
    }

    /// As [`Self::start`], with tokens valid for `lifetime` seconds (negative: expired).
    pub async fn start_with_lifetime(lifetime: i64) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ca =
            CertificateAuthority::load_or_create(&dir.path().join("ca"), "fake issuer CA").unwrap();
        let cert = ca
            .issue_server_cert(&["127.0.0.1".to_string(), "localhost".to_string()])
            .unwrap();
        let ca_pem = ca.cert_pem().to_string();
        let ca_file = dir.path().join("issuer-ca.pem");
        std::fs::write(&ca_file, &ca_pem).unwrap();
        use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
        let certs = CertificateDer::pem_slice_iter(cert.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).unwrap();
        let tls = tokio_rustls::rustls::ServerConfig::builder_with_provider(Arc::new(
            tokio_rustls::rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "https://127.0.0.1:{}",
            listener.local_addr().unwrap().port()
        );
        let users = [
            ("alice", "alice-pw"),
            ("bob", "bob-pw"),
            ("carol", "carol-pw"),
        ]
        .into_iter()
        .map(|(u, p)| (u.to_string(), p.to_string()))
        .collect();
        let state = Arc::new(State {
            url: url.clone(),
            key: new_key(),
            users,
            codes: Mutex::new(HashMap::new()),
            refresh: Mutex::new(HashMap::new()),
            jwks_fetches: AtomicUsize::new(0),
            token_lifetime: lifetime,
            counter: AtomicUsize::new(0),
            device_script: Mutex::new(DeviceScript::default()),
            devices: Mutex::new(HashMap::new()),
            authorize_error: Mutex::new(None),
            authorize_requests: AtomicUsize::new(0),
            nonce_override: Mutex::new(None),
        });
        let s = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    continue;
                };
                let (acceptor, s) = (acceptor.clone(), s.clone());
                tokio::spawn(async move {
                    if let Ok(tls) = acceptor.accept(conn).await {
                        let _ = handle(tls, &s).await;
                    }
                });
            }
        });
        Self {
            url,
            ca_pem,
            ca_file,
            state,
            task,
            _dir: dir,
        }
    }

    /// Claims of a token for `sub` with audience `aud`, valid for `lifetime` seconds from now.
    pub fn claims(&self, sub: &str, aud: &str, lifetime: i64) -> Value {
        let now = now();
        json!({"iss": self.url, "sub": sub, "aud": aud, "iat": now, "exp": now + lifetime})
    }

    /// A token signed with the issuer's key.
    pub fn mint(&self, claims: &Value) -> String {
        sign(&self.state.key, Self::KID, claims)
    }

    /// A token signed with a key the JWKS does not hold, under `kid`.
    pub fn mint_with_foreign_key(&self, kid: &str, claims: &Value) -> String {
        sign(&new_key(), kid, claims)
    }

    /// What the device codes handed out from now on answer.
    pub fn set_device_script(&self, script: DeviceScript) {
        *self.state.device_script.lock().unwrap() = script;
    }

    /// When each device code handed out so far was polled, by code.
    pub fn device_polls(&self) -> Vec<Vec<std::time::Instant>> {
        let devices = self.state.devices.lock().unwrap();
        let mut codes: Vec<&String> = devices.keys().collect();
        codes.sort();
        codes.iter().map(|c| devices[*c].polls.clone()).collect()
    }

    /// What the authorize endpoint answers from now on: `Some(error)` (e.g. `access_denied`)
    /// redirects back with that error instead of a code; `None` approves.
    pub fn set_authorize_error(&self, error: Option<&str>) {
        *self.state.authorize_error.lock().unwrap() = error.map(str::to_owned);
    }

    /// The `nonce` the ID tokens of codes handed out from now on carry: `Some(n)` instead of
    /// the authorization request's (a replayed or foreign ID token); `None`, the request's.
    pub fn set_id_token_nonce(&self, nonce: Option<&str>) {
        *self.state.nonce_override.lock().unwrap() = nonce.map(str::to_owned);
    }

    /// How many authorization requests the authorize endpoint answered.
    pub fn authorize_requests(&self) -> usize {
        self.state.authorize_requests.load(Ordering::SeqCst)
    }

    /// How often the JWKS was fetched.
    pub fn jwks_fetches(&self) -> usize {
        self.state.jwks_fetches.load(Ordering::SeqCst)
    }

    /// An `authentication` section accepting this issuer: audience `jumpstarter-cli`,
    /// username `<prefix><sub>`, trusting the issuer's CA by file.
    pub fn authentication_yaml(&self, prefix: &str) -> String {
        format!(
            "jwt:\n- issuer:\n    url: {}\n    audiences: [jumpstarter-cli]\n    certificateAuthority: {}\n  claimMappings:\n    username:\n      claim: sub\n      prefix: \"{prefix}\"\n",
            self.url,
            self.ca_file.display()
        )
    }
}

impl Drop for FakeIssuer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl State {
    fn next(&self, what: &str) -> String {
        format!("{what}-{}", self.counter.fetch_add(1, Ordering::SeqCst))
    }

    fn tokens(&self, grant: Grant) -> Value {
        let now = now();
        let mut claims = json!({
            "iss": self.url, "sub": grant.user, "aud": grant.client_id,
            "email": format!("{}@example.com", grant.user),
            "iat": now, "exp": now + self.token_lifetime,
        });
        if let Some(nonce) = &grant.nonce {
            claims["nonce"] = nonce.clone().into();
        }
        let token = sign(&self.key, FakeIssuer::KID, &claims);
        let refresh = self.next("refresh");
        self.refresh.lock().unwrap().insert(refresh.clone(), grant);
        json!({
            "access_token": token, "id_token": token, "token_type": "Bearer",
            "expires_in": self.token_lifetime, "refresh_token": refresh,
        })
    }

    fn token_endpoint(&self, form: &HashMap<String, String>) -> (u16, Value) {
        let get = |k: &str| form.get(k).cloned().unwrap_or_default();
        let client_id = get("client_id");
        let invalid = |d: &str| {
            (
                400,
                json!({"error": "invalid_grant", "error_description": d}),
            )
        };
        match get("grant_type").as_str() {
            "password" => {
                let user = get("username");
                if self.users.get(&user) != Some(&get("password")) {
                    return invalid("wrong username or password");
                }
                (
                    200,
                    self.tokens(Grant {
                        user,
                        client_id,
                        nonce: None,
                    }),
                )
            }
            "refresh_token" => {
                // The guard must be gone before `tokens` locks the map again.
                let grant = self.refresh.lock().unwrap().remove(&get("refresh_token"));
                match grant {
                    Some(g) => (200, self.tokens(Grant { nonce: None, ..g })),
                    None => invalid("unknown refresh token"),
                }
            }
            "authorization_code" => {
                let Some((challenge, redirect, g)) =
                    self.codes.lock().unwrap().remove(&get("code"))
                else {
                    return invalid("unknown code");
                };
                let expected = URL_SAFE_NO_PAD.encode(ring::digest::digest(
                    &ring::digest::SHA256,
                    get("code_verifier").as_bytes(),
                ));
                if expected != challenge || redirect != get("redirect_uri") {
                    return invalid("PKCE or redirect_uri mismatch");
                }
                (200, self.tokens(g))
            }
            oidc::DEVICE_CODE_GRANT => {
                let mut devices = self.devices.lock().unwrap();
                let Some(d) = devices.get_mut(&get("device_code")) else {
                    return invalid("unknown device code");
                };
                if d.client_id != client_id {
                    return invalid("client_id mismatch");
                }
                d.polls.push(std::time::Instant::now());
                let n = d.polls.len() as u32;
                let error = |e: &str| (400, json!({"error": e}));
                if n <= d.script.pending {
                    return if d.script.slow_down_at == Some(n) {
                        error("slow_down")
                    } else {
                        error("authorization_pending")
                    };
                }
                match d.script.outcome {
                    DeviceOutcome::Approve => {
                        let grant = Grant {
                            user: FakeIssuer::BROWSER_USER.into(),
                            client_id,
                            nonce: None,
                        };
                        drop(devices);
                        (200, self.tokens(grant))
                    }
                    DeviceOutcome::Deny => error("access_denied"),
                    DeviceOutcome::Expire => error("expired_token"),
                }
            }
            other => (
                400,
                json!({"error": "unsupported_grant_type", "error_description": other}),
            ),
        }
    }

    /// `POST /device`: a device code playing the current [`DeviceScript`].
    fn device_authorization(&self, form: &HashMap<String, String>) -> Value {
        let device_code = self.next("device");
        let user_code = self.next("USER");
        let script = self.device_script.lock().unwrap().clone();
        let interval = script.interval;
        self.devices.lock().unwrap().insert(
            device_code.clone(),
            Device {
                script,
                client_id: form.get("client_id").cloned().unwrap_or_default(),
                polls: Vec::new(),
            },
        );
        json!({
            "device_code": device_code,
            "user_code": user_code,
            "verification_uri": format!("{}/activate", self.url),
            "expires_in": 300,
            "interval": interval,
        })
    }
}

async fn handle<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut conn: S,
    s: &State,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = String::from_utf8_lossy(&buf[head_end..]).into_owned();
    let mut first = head.lines().next().unwrap_or("").split(' ');
    let (method, target) = (first.next().unwrap_or(""), first.next().unwrap_or(""));
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let params: HashMap<String, String> = oidc::form_decode(query).into_iter().collect();
    let (status, extra, body): (u16, String, String) = match (method, path) {
        ("GET", "/.well-known/openid-configuration") => (
            200,
            String::new(),
            json!({
                "issuer": s.url,
                "jwks_uri": format!("{}/jwks", s.url),
                "token_endpoint": format!("{}/token", s.url),
                "authorization_endpoint": format!("{}/authorize", s.url),
                "device_authorization_endpoint": format!("{}/device", s.url),
            })
            .to_string(),
        ),
        // As a Kubernetes API server does (`/openid/v1/jwks`): the keys only for a client
        // that accepts `application/jwk-set+json`, else 406.
        ("GET", "/jwks")
            if !head.lines().any(|l| {
                l.split_once(':').is_some_and(|(k, v)| {
                    k.eq_ignore_ascii_case("accept") && v.contains("application/jwk-set+json")
                })
            }) =>
        {
            (
                406,
                String::new(),
                "406: Not Acceptable\n\nAvailable representations: application/jwk-set+json".into(),
            )
        }
        ("GET", "/jwks") => {
            s.jwks_fetches.fetch_add(1, Ordering::SeqCst);
            let point = s.key.public_key().as_ref();
            (
                200,
                String::new(),
                json!({"keys": [{
                    "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256",
                    "kid": FakeIssuer::KID,
                    "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
                    "y": URL_SAFE_NO_PAD.encode(&point[33..65]),
                }]})
                .to_string(),
            )
        }
        ("GET", "/authorize") => {
            let get = |k: &str| params.get(k).cloned().unwrap_or_default();
            s.authorize_requests.fetch_add(1, Ordering::SeqCst);
            let refusal = s.authorize_error.lock().unwrap().clone();
            if get("code_challenge_method") != "S256" || get("response_type") != "code" {
                (400, String::new(), "bad authorize request".into())
            } else if let Some(error) = refusal {
                let location = format!(
                    "{}?{}",
                    get("redirect_uri"),
                    oidc::form_encode(&[
                        ("error", &error),
                        ("error_description", "the user said no"),
                        ("state", &get("state")),
                    ])
                );
                (302, format!("Location: {location}\r\n"), String::new())
            } else {
                let code = s.next("code");
                let redirect = get("redirect_uri");
                s.codes.lock().unwrap().insert(
                    code.clone(),
                    (
                        get("code_challenge"),
                        redirect.clone(),
                        Grant {
                            user: FakeIssuer::BROWSER_USER.into(),
                            client_id: get("client_id"),
                            nonce: s
                                .nonce_override
                                .lock()
                                .unwrap()
                                .clone()
                                .or_else(|| params.get("nonce").cloned()),
                        },
                    ),
                );
                let location = format!(
                    "{redirect}?{}",
                    oidc::form_encode(&[("code", &code), ("state", &get("state"))])
                );
                (302, format!("Location: {location}\r\n"), String::new())
            }
        }
        ("POST", "/device") => {
            let form: HashMap<String, String> = oidc::form_decode(&body).into_iter().collect();
            (
                200,
                String::new(),
                s.device_authorization(&form).to_string(),
            )
        }
        ("POST", "/token") => {
            let form: HashMap<String, String> = oidc::form_decode(&body).into_iter().collect();
            let (status, doc) = s.token_endpoint(&form);
            (status, String::new(), doc.to_string())
        }
        _ => (404, String::new(), "not found".into()),
    };
    let reply = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(reply.as_bytes()).await?;
    conn.shutdown().await
}
