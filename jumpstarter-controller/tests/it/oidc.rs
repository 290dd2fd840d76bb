//! External OIDC authentication (§2.1, §3.2): tokens of a fake issuer on loopback HTTPS,
//! verified through discovery and its JWKS; the Client's `spec.username` decides; bad
//! tokens are refused with upstream's codes and texts.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    time::Duration,
};

use jumpstarter_controller::{
    ControllerConfig, RunningController,
    objects::{Client, ClientSpec, Exporter, ExporterSpec},
    read_authentication_file, start,
    store::Store,
};
use jumpstarter_core::{
    client::{ConnectOptions, SessionChannel, connect_channel},
    config::AdminConfig,
    oidc::HttpsClient,
};
use jumpstarter_proto::client_v1::{
    ListExportersRequest, client_service_client::ClientServiceClient,
};
use tonic::Code;

use jumpstarter_controller::testing::FakeIssuer;

const PREFIX: &str = "fake:";

async fn controller(
    issuer: &FakeIssuer,
    provisioning: bool,
) -> (RunningController, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("auth.yaml");
    std::fs::write(&file, issuer.authentication_yaml(PREFIX)).unwrap();
    let (auth, _) = read_authentication_file(&file).unwrap();
    let ctl = start(ControllerConfig {
        jwt_authenticators: auth.jwt,
        provisioning,
        ..ControllerConfig::loopback(dir.path().join("data"))
    })
    .await
    .unwrap();
    (ctl, dir)
}

async fn channel(endpoint: &str, ca_pem: &str) -> SessionChannel {
    connect_channel(
        endpoint,
        &ConnectOptions {
            insecure: false,
            passphrase: None,
            ca_pem: Some(ca_pem.as_bytes().to_vec()),
        },
    )
    .await
    .unwrap()
}

/// `ListExporters` as a Client with `token`, naming the object only when `name` is given.
async fn list(ch: &SessionChannel, token: &str, name: Option<&str>) -> Result<(), tonic::Status> {
    let mut r = tonic::Request::new(ListExportersRequest {
        parent: "namespaces/default".into(),
        ..Default::default()
    });
    let md = r.metadata_mut();
    md.insert("authorization", format!("Bearer {token}").parse().unwrap());
    md.insert("jumpstarter-kind", "Client".parse().unwrap());
    md.insert("jumpstarter-namespace", "default".parse().unwrap());
    if let Some(n) = name {
        md.insert("jumpstarter-name", n.parse().unwrap());
    }
    ClientServiceClient::new(ch.clone())
        .list_exporters(r)
        .await
        .map(|_| ())
}

async fn add_client(ctl: &RunningController, name: &str, username: &str) {
    let mut c = Client::new(
        name,
        ClientSpec {
            username: Some(username.into()),
        },
    );
    c.metadata.namespace = Some("default".into());
    ctl.state.store.create(&c).await.unwrap();
}

#[tokio::test]
async fn external_token_acts_as_the_client_with_its_username() {
    let issuer = FakeIssuer::start().await;
    let (ctl, _dir) = controller(&issuer, false).await;
    let ch = channel(&format!("localhost:{}", ctl.addr.port()), &ctl.ca_pem).await;
    let alice = issuer.mint(&issuer.claims("alice", "jumpstarter-cli", 600));

    // No Client "alice" yet, provisioning off: NOT_FOUND.
    let e = list(&ch, &alice, None).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(
        ctl.state
            .store
            .get::<Client>("default", "alice")
            .await
            .unwrap()
            .is_none()
    );

    // A Client of that name owned by someone else: PERMISSION_DENIED.
    add_client(&ctl, "alice", "fake:mallory").await;
    let e = list(&ch, &alice, None).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert_eq!(e.message(), "permission denied for client default/alice");

    // The owner: the name is derived from the username, or given and equal.
    let mut c = ctl
        .state
        .store
        .get::<Client>("default", "alice")
        .await
        .unwrap()
        .unwrap();
    c.spec.username = Some("fake:alice".into());
    ctl.state.store.update(&c).await.unwrap();
    list(&ch, &alice, None).await.unwrap();
    list(&ch, &alice, Some("alice")).await.unwrap();
    let e = list(&ch, &alice, Some("bob")).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("resource name mismatch"), "{e:?}");

    // A username that derives to a name no Client has, though another Client carries it.
    add_client(&ctl, "dave-laptop", "fake:Dave.Smith@example.com").await;
    let dave = issuer.mint(&issuer.claims("Dave.Smith@example.com", "jumpstarter-cli", 600));
    let e = list(&ch, &dave, None).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(e.message().contains("dave-smith-example-com"), "{e:?}");
    add_client(
        &ctl,
        "dave-smith-example-com",
        "fake:Dave.Smith@example.com",
    )
    .await;
    list(&ch, &dave, None).await.unwrap();

    // An Exporter token on a client RPC is refused by kind before anything else.
    let mut ex = Exporter::new("alice-ex", ExporterSpec::default());
    ex.metadata.namespace = Some("default".into());
    ex.spec.username = Some("fake:alice".into());
    ctl.state.store.create(&ex).await.unwrap();
    let mut r = tonic::Request::new(ListExportersRequest {
        parent: "namespaces/default".into(),
        ..Default::default()
    });
    r.metadata_mut()
        .insert("authorization", format!("Bearer {alice}").parse().unwrap());
    r.metadata_mut()
        .insert("jumpstarter-kind", "Exporter".parse().unwrap());
    r.metadata_mut()
        .insert("jumpstarter-namespace", "default".parse().unwrap());
    let e = ClientServiceClient::new(ch.clone())
        .list_exporters(r)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(e.message(), "object kind mismatch");
    ctl.shutdown().await;
}

#[tokio::test]
async fn bad_external_tokens_are_refused_with_clear_messages() {
    let issuer = FakeIssuer::start().await;
    let (ctl, _dir) = controller(&issuer, false).await;
    let ch = channel(&format!("localhost:{}", ctl.addr.port()), &ctl.ca_pem).await;
    add_client(&ctl, "alice", "fake:alice").await;
    let good = issuer.mint(&issuer.claims("alice", "jumpstarter-cli", 600));
    list(&ch, &good, None).await.unwrap();
    assert_eq!(issuer.jwks_fetches(), 1);

    let unknown = |e: tonic::Status, needle: &str| {
        assert_eq!(e.code(), Code::Unknown, "{e:?}");
        assert!(e.message().contains(needle), "{needle:?} not in {e:?}");
    };
    // Expired: the Python client matches this text to log in again.
    let expired = issuer.mint(&issuer.claims("alice", "jumpstarter-cli", -10));
    unknown(
        list(&ch, &expired, None).await.unwrap_err(),
        "token is expired",
    );
    // Wrong audience.
    let aud = issuer.mint(&issuer.claims("alice", "other-app", 600));
    unknown(list(&ch, &aud, None).await.unwrap_err(), "audience");
    // Tampered: the claims of one token with the signature of another.
    let other = issuer.mint(&issuer.claims("mallory", "jumpstarter-cli", 600));
    let parts: Vec<&str> = good.split('.').collect();
    let other_parts: Vec<&str> = other.split('.').collect();
    let tampered = format!("{}.{}.{}", parts[0], other_parts[1], parts[2]);
    unknown(
        list(&ch, &tampered, None).await.unwrap_err(),
        "invalid token signature",
    );
    // Unknown kid: refused; the JWKS was fetched moments ago, so not again (rate limit)...
    let claims = issuer.claims("alice", "jumpstarter-cli", 600);
    let foreign = issuer.mint_with_foreign_key("rogue", &claims);
    unknown(list(&ch, &foreign, None).await.unwrap_err(), "\"rogue\"");
    unknown(list(&ch, &foreign, None).await.unwrap_err(), "\"rogue\"");
    assert_eq!(
        issuer.jwks_fetches(),
        1,
        "JWKS refetch must be rate-limited"
    );
    // ...but once the limit has passed, an unknown kid makes it fetch the JWKS again.
    tokio::time::sleep(Duration::from_millis(10_500)).await;
    unknown(list(&ch, &foreign, None).await.unwrap_err(), "\"rogue\"");
    assert_eq!(issuer.jwks_fetches(), 2);
    // A foreign key under the issuer's own kid: a signature failure.
    let forged = issuer.mint_with_foreign_key(FakeIssuer::KID, &claims);
    unknown(
        list(&ch, &forged, None).await.unwrap_err(),
        "invalid token signature",
    );
    // Wrong issuer: not an external issuer, so the internal one judges it (and refuses).
    let mut wrong_iss = claims.clone();
    wrong_iss["iss"] = "https://issuer.invalid".into();
    let wrong_iss = issuer.mint(&wrong_iss);
    let e = list(&ch, &wrong_iss, Some("alice")).await.unwrap_err();
    assert_eq!(e.code(), Code::Unknown, "{e:?}");
    // Not a JWT at all.
    assert_eq!(
        list(&ch, "garbage", Some("alice"))
            .await
            .unwrap_err()
            .code(),
        Code::Unknown
    );
    // A valid token whose username no Client carries.
    let bob = issuer.mint(&issuer.claims("bob", "jumpstarter-cli", 600));
    assert_eq!(
        list(&ch, &bob, None).await.unwrap_err().code(),
        Code::NotFound
    );
    assert_eq!(
        list(&ch, &bob, Some("alice")).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    // Good tokens keep working, from the cached keys.
    list(&ch, &good, None).await.unwrap();
    assert_eq!(issuer.jwks_fetches(), 2);
    ctl.shutdown().await;
}

#[tokio::test]
async fn provisioning_creates_the_client_on_first_login() {
    let issuer = FakeIssuer::start().await;
    let (ctl, _dir) = controller(&issuer, true).await;
    let ch = channel(&format!("localhost:{}", ctl.addr.port()), &ctl.ca_pem).await;
    let bob = issuer.mint(&issuer.claims("bob", "jumpstarter-cli", 600));
    list(&ch, &bob, None).await.unwrap();
    let c = ctl
        .state
        .store
        .get::<Client>("default", "bob")
        .await
        .unwrap()
        .expect("client provisioned");
    assert_eq!(c.spec.username.as_deref(), Some("fake:bob"));
    // Again: the same object is used.
    list(&ch, &bob, None).await.unwrap();
    // Provisioning never takes over an existing Client of another user.
    add_client(&ctl, "eve", "fake:someone-else").await;
    let eve = issuer.mint(&issuer.claims("eve", "jumpstarter-cli", 600));
    assert_eq!(
        list(&ch, &eve, None).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    ctl.shutdown().await;
}

/// A controller process, killed when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn binary_takes_authentication_config_and_serves_easy_login() {
    let issuer = FakeIssuer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("auth.yaml");
    // The whole-config shape, with provisioning on.
    let section: String = issuer
        .authentication_yaml(PREFIX)
        .lines()
        .map(|l| format!("  {l}\n"))
        .collect();
    std::fs::write(
        &file,
        format!("authentication:\n{section}provisioning:\n  enabled: true\n"),
    )
    .unwrap();
    let admin_path = dir.path().join("admin.yaml");
    let mut child = Command::new(env!("CARGO_BIN_EXE_jumpstarter-controller"))
        .args(["--listen", "127.0.0.1:0", "--router-listen", "127.0.0.1:0"])
        .args(["--metrics-listen", "off", "--login-listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--admin-config")
        .arg(&admin_path)
        .arg("--authentication-config")
        .arg(&file)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let _process = Process(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let login_url = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("controller did not report its login listener");
        if let Some(rest) = line.strip_prefix("Easy login served at ") {
            break rest.trim().to_string();
        }
    };
    let cfg = AdminConfig::load(&admin_path).unwrap();
    let ca = cfg.ca_pem().unwrap().unwrap();
    // Easy login: the document names the endpoint, namespace, CA and issuer.
    let http = HttpsClient::new(Some(&ca), false).unwrap();
    let doc = http.get_json(&login_url).await.unwrap();
    assert_eq!(doc["grpcEndpoint"], cfg.endpoint.as_str());
    assert_eq!(doc["namespace"], "default");
    assert_eq!(doc["oidc"][0]["issuer"], issuer.url.as_str());
    assert_eq!(doc["oidc"][0]["clientId"], "jumpstarter-cli");
    assert!(
        doc["caBundle"]
            .as_str()
            .unwrap()
            .contains("BEGIN CERTIFICATE")
    );
    let other = http
        .get(&login_url.replace("/v1/auth/config", "/nope"))
        .await
        .unwrap();
    assert_eq!(other.status.as_u16(), 404);
    // An external token works against the binary, provisioning its Client.
    let ch = channel(&cfg.endpoint, &ca).await;
    let carol = issuer.mint(&issuer.claims("carol", "jumpstarter-cli", 600));
    list(&ch, &carol, None).await.unwrap();
    let expired = issuer.mint(&issuer.claims("carol", "jumpstarter-cli", -5));
    let e = list(&ch, &expired, None).await.unwrap_err();
    assert!(e.message().contains("token is expired"), "{e:?}");
}

#[tokio::test]
async fn unusable_authentication_config_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let e = match start(ControllerConfig {
        jwt_authenticators: vec![serde_json::json!({
            "issuer": {"url": "http://dex.example.com", "audiences": ["x"]},
            "claimMappings": {"username": {"claim": "sub", "prefix": ""}},
        })],
        ..ControllerConfig::loopback(dir.path().join("data"))
    })
    .await
    {
        Ok(_) => panic!("started with an http:// issuer"),
        Err(e) => jumpstarter_core::error_chain(&e),
    };
    assert!(e.contains("issuer.url"), "{e}");
    // From the command line: no audiences, and an unknown field, each named.
    for (i, (text, want)) in [
        ("jwt:\n- issuer: {url: https://x}\n", "issuer.audiences"),
        (
            "jwt:\n- issuer: {url: https://x, audiences: [a]}\n  bogus: 1\n",
            "unknown field `bogus`",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let bad = dir.path().join(format!("bad{i}.yaml"));
        std::fs::write(&bad, text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_jumpstarter-controller"))
            .args(["--listen", "127.0.0.1:0", "--router-listen", "127.0.0.1:0"])
            .args(["--metrics-listen", "off", "--no-admin-config"])
            .arg("--data-dir")
            .arg(dir.path().join(format!("data-bad{i}")))
            .arg("--authentication-config")
            .arg(&bad)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want) && err.contains("https://x"), "{err}");
    }
}
