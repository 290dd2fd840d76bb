//! `jmp login` and `jmp auth refresh|status` against a fake OIDC issuer on loopback HTTPS
//! and a controller that accepts its tokens (external `authentication.jwt`).

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::Duration,
};

use jumpstarter_controller::{
    ControllerConfig, RunningController,
    objects::{Client, ClientSpec, Exporter, ExporterSpec},
    read_authentication_file, start,
    store::Store,
};
use jumpstarter_core::{config::ClientConfig, oidc::HttpsClient};

use jumpstarter_controller::testing::{DeviceOutcome, DeviceScript, FakeIssuer};

use crate::{JMP, text};

struct OidcLab {
    rt: tokio::runtime::Runtime,
    issuer: Option<FakeIssuer>,
    controller: Option<RunningController>,
    dir: tempfile::TempDir,
    /// Issuer CA + controller CA: what `SSL_CERT_FILE` points `jmp` at.
    roots: PathBuf,
}

impl OidcLab {
    fn new(provisioning: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let issuer = rt.block_on(FakeIssuer::start());
        let file = dir.path().join("auth.yaml");
        std::fs::write(&file, issuer.authentication_yaml("fake:")).unwrap();
        let (auth, _) = read_authentication_file(&file).unwrap();
        let controller = rt
            .block_on(start(ControllerConfig {
                jwt_authenticators: auth.jwt,
                provisioning,
                login_listen: Some("127.0.0.1:0".into()),
                ..ControllerConfig::loopback(dir.path().join("data"))
            }))
            .unwrap();
        let roots = dir.path().join("roots.pem");
        std::fs::write(&roots, format!("{}{}", issuer.ca_pem, controller.ca_pem)).unwrap();
        let lab = Self {
            rt,
            issuer: Some(issuer),
            controller: Some(controller),
            dir,
            roots,
        };
        lab.add_exporter("ex1");
        lab
    }

    fn issuer(&self) -> &FakeIssuer {
        self.issuer.as_ref().unwrap()
    }

    fn ctl(&self) -> &RunningController {
        self.controller.as_ref().unwrap()
    }

    fn add_exporter(&self, name: &str) {
        let mut e = Exporter::new(name, ExporterSpec::default());
        e.metadata.namespace = Some("default".into());
        self.rt.block_on(self.ctl().state.store.create(&e)).unwrap();
    }

    fn add_client(&self, name: &str, username: &str) {
        let mut c = Client::new(
            name,
            ClientSpec {
                username: Some(username.into()),
            },
        );
        c.metadata.namespace = Some("default".into());
        self.rt.block_on(self.ctl().state.store.create(&c)).unwrap();
    }

    fn config_dir(&self) -> PathBuf {
        self.dir.path().join("config")
    }

    fn client_path(&self, alias: &str) -> PathBuf {
        self.config_dir()
            .join("clients")
            .join(format!("{alias}.yaml"))
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new(JMP);
        c.current_dir(self.dir.path())
            .env("JMP_CLIENT_CONFIG_HOME", self.config_dir())
            .env("SSL_CERT_FILE", &self.roots)
            .env_remove("SSL_CERT_DIR")
            .env_remove("JMP_NAME")
            .env_remove("JMP_NAMESPACE")
            .env_remove("JMP_ENDPOINT")
            .env_remove("JMP_TOKEN")
            .env_remove("JMP_GRPC_INSECURE")
            .env_remove("JUMPSTARTER_GRPC_INSECURE")
            .env_remove("JMP_OIDC_CALLBACK_PORT")
            .env_remove("DISPLAY")
            .env_remove("WAYLAND_DISPLAY")
            .stdin(Stdio::null());
        c
    }

    fn jmp(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.jmp(args);
        let (stdout, stderr) = text(&out);
        assert!(
            out.status.success(),
            "jmp {args:?} failed: {stdout}{stderr}"
        );
        format!("{stdout}{stderr}")
    }

    fn fails(&self, args: &[&str]) -> String {
        let out = self.jmp(args);
        let (stdout, stderr) = text(&out);
        assert!(
            !out.status.success(),
            "jmp {args:?} should fail: {stdout}{stderr}"
        );
        assert!(stderr.starts_with("Error: "), "{stderr}");
        stderr
    }

    fn endpoint(&self) -> String {
        format!("localhost:{}", self.ctl().addr.port())
    }

    /// `jmp login --device-flow` into client alias `alias` (named `carol`, the user the fake
    /// issuer approves device codes for).
    fn device_login_args(&self, alias: &str) -> Vec<String> {
        [
            "login",
            "--client",
            alias,
            "-e",
            &self.endpoint(),
            "--namespace",
            "default",
            "--name",
            "carol",
            "--issuer",
            &self.issuer().url,
            "--device-flow",
            "-k",
            "--nointeractive",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// `jmp login` with the password grant for `user` into client alias `user`.
    fn password_login_args(&self, user: &str, password: &str) -> Vec<String> {
        [
            "login",
            "--client",
            user,
            "-e",
            &self.endpoint(),
            "--namespace",
            "default",
            "--name",
            user,
            "--issuer",
            &self.issuer().url,
            "--username",
            user,
            "--password",
            password,
            "-k",
            "--nointeractive",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }
}

impl Drop for OidcLab {
    fn drop(&mut self) {
        if let Some(c) = self.controller.take() {
            self.rt.block_on(c.shutdown());
        }
        if let Some(i) = self.issuer.take() {
            let _guard = self.rt.enter();
            drop(i);
        }
    }
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn load(path: &Path) -> ClientConfig {
    ClientConfig::load(path).unwrap()
}

#[test]
fn password_login_then_get_exporters_refresh_and_status() {
    let lab = OidcLab::new(false);
    lab.add_client("alice", "fake:alice");

    // A wrong password writes nothing.
    let e = lab.fails(&args(&lab.password_login_args("alice", "wrong")));
    assert!(e.contains("invalid_grant"), "{e}");
    assert!(!lab.client_path("alice").exists());

    let out = lab.ok(&args(&lab.password_login_args("alice", "alice-pw")));
    assert!(out.contains("Login successful"), "{out}");
    let cfg = load(&lab.client_path("alice"));
    let token = cfg.token.clone().unwrap();
    let refresh = cfg.refresh_token.clone().unwrap();
    assert_eq!(cfg.endpoint.as_deref(), Some(lab.endpoint().as_str()));
    assert_eq!(cfg.metadata.name, "alice");
    assert!(cfg.tls.insecure);
    assert_eq!(
        jumpstarter_core::oidc::token_issuer(&token).as_deref(),
        Some(lab.issuer().url.as_str())
    );
    // The first client created becomes the current one.
    let user = std::fs::read_to_string(lab.config_dir().join("config.yaml")).unwrap();
    assert!(user.contains("alice"), "{user}");

    let listed = lab.ok(&["get", "exporters", "--client", "alice", "-o", "name"]);
    assert!(listed.contains("ex1"), "{listed}");

    let status = lab.ok(&["auth", "status", "--client", "alice", "-v"]);
    assert!(status.contains("Valid ("), "{status}");
    assert!(status.contains("Refresh Token Stored:  yes"), "{status}");
    assert!(status.contains(&lab.issuer().url), "{status}");

    // Refresh: a new token and refresh token, and they work.
    std::thread::sleep(Duration::from_millis(1100));
    let out = lab.ok(&["auth", "refresh", "--client", "alice"]);
    assert!(out.contains("Token refreshed"), "{out}");
    let cfg = load(&lab.client_path("alice"));
    assert_ne!(cfg.token.as_deref(), Some(token.as_str()));
    assert_ne!(cfg.refresh_token.as_deref(), Some(refresh.as_str()));
    assert!(
        lab.ok(&["get", "exporters", "--client", "alice", "-o", "name"])
            .contains("ex1")
    );
    // The old refresh token was used up: refreshing with it fails and keeps the file.
    let mut stale = cfg.clone();
    stale.refresh_token = Some(refresh);
    stale.save(&lab.client_path("alice")).unwrap();
    let before = std::fs::read_to_string(lab.client_path("alice")).unwrap();
    let e = lab.fails(&["auth", "refresh", "--client", "alice"]);
    assert!(e.contains("invalid_grant"), "{e}");
    assert_eq!(
        std::fs::read_to_string(lab.client_path("alice")).unwrap(),
        before
    );
}

#[test]
fn login_for_a_user_without_client_is_refused_by_the_controller() {
    let lab = OidcLab::new(false);
    lab.ok(&args(&lab.password_login_args("bob", "bob-pw")));
    let e = lab.fails(&["get", "exporters", "--client", "bob"]);
    assert!(e.contains("default/bob"), "{e}");
    // A Client "bob" owned by another username: denied.
    lab.add_client("bob", "fake:someone-else");
    let e = lab.fails(&["get", "exporters", "--client", "bob"]);
    assert!(e.contains("permission denied"), "{e}");
}

#[test]
fn provisioning_lets_a_new_user_in() {
    let lab = OidcLab::new(true);
    lab.ok(&args(&lab.password_login_args("bob", "bob-pw")));
    assert!(
        lab.ok(&["get", "exporters", "--client", "bob", "-o", "name"])
            .contains("ex1")
    );
}

#[test]
fn token_flag_stores_the_token_as_given() {
    let lab = OidcLab::new(false);
    lab.add_client("alice", "fake:alice");
    let token = lab
        .issuer()
        .mint(&lab.issuer().claims("alice", "jumpstarter-cli", 600));
    let endpoint = lab.endpoint();
    lab.ok(&[
        "login",
        "--client",
        "alice",
        "-e",
        &endpoint,
        "--namespace",
        "default",
        "--name",
        "alice",
        "--token",
        &token,
        "-k",
        "--nointeractive",
    ]);
    let cfg = load(&lab.client_path("alice"));
    assert_eq!(cfg.token.as_deref(), Some(token.as_str()));
    assert_eq!(cfg.refresh_token, None);
    assert!(
        lab.ok(&["get", "exporters", "--client", "alice", "-o", "name"])
            .contains("ex1")
    );
    // No refresh token stored: refresh explains what to do.
    let e = lab.fails(&["auth", "refresh", "--client", "alice"]);
    assert!(e.contains("no refresh token"), "{e}");
    // An expired token: the controller's message keeps upstream's text.
    let expired = lab
        .issuer()
        .mint(&lab.issuer().claims("alice", "jumpstarter-cli", -5));
    lab.ok(&[
        "login",
        "--client",
        "alice",
        "--token",
        &expired,
        "--nointeractive",
    ]);
    let e = lab.fails(&["get", "exporters", "--client", "alice"]);
    assert!(e.contains("token is expired"), "{e}");
}

#[test]
fn bad_login_inputs_are_refused_without_writing() {
    let lab = OidcLab::new(false);
    let issuer = lab.issuer().url.clone();
    // Missing endpoint/namespace for a new config.
    let e = lab.fails(&[
        "login",
        "--client",
        "new",
        "--issuer",
        &issuer,
        "--username",
        "alice",
        "--password",
        "alice-pw",
        "--nointeractive",
    ]);
    assert!(e.contains("--endpoint") && e.contains("--namespace"), "{e}");
    let endpoint = lab.endpoint();
    let base = [
        "login",
        "--client",
        "new",
        "-e",
        &endpoint,
        "--namespace",
        "default",
        "--name",
        "new",
        "--nointeractive",
    ];
    // No issuer and no token.
    let e = lab.fails(&[&base[..], &["--username", "alice", "--password", "x"]].concat());
    assert!(e.contains("--issuer"), "{e}");
    // --password without --username, and the reverse.
    let e = lab.fails(&[&base[..], &["--issuer", &issuer, "--password", "x"]].concat());
    assert!(e.contains("--username"), "{e}");
    let e = lab.fails(&[&base[..], &["--issuer", &issuer, "--username", "alice"]].concat());
    assert!(e.contains("--password"), "{e}");
    // An issuer that is not there.
    let e = lab.fails(
        &[
            &base[..],
            &[
                "--issuer",
                "https://127.0.0.1:1",
                "--username",
                "a",
                "--password",
                "b",
            ],
        ]
        .concat(),
    );
    assert!(e.contains("127.0.0.1:1"), "{e}");
    // An unreachable login service.
    let e = lab.fails(&["login", "x@127.0.0.1:1", "--nointeractive"]);
    assert!(e.contains("/v1/auth/config"), "{e}");
    assert!(!lab.client_path("new").exists());
    assert!(!lab.client_path("x").exists());
}

/// Easy login (`client@host:port` reads `/v1/auth/config`) with the browser flow: the test
/// plays the browser, following the authorize redirect to jmp's callback.
#[test]
fn easy_login_with_the_browser_flow() {
    let lab = OidcLab::new(false);
    lab.add_client("carol", &format!("fake:{}", FakeIssuer::BROWSER_USER));
    let login = lab.ctl().login_addr.unwrap();
    let mut child = lab
        .cmd()
        .args(["login", &format!("carol@127.0.0.1:{}", login.port())])
        .args(["--callback-port", "0", "--nointeractive"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let url = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("jmp login printed no URL");
        if line.starts_with(&lab.issuer().url) {
            break line;
        }
    };
    assert!(url.contains("code_challenge_method=S256"), "{url}");
    let http = HttpsClient::new(Some(&lab.issuer().ca_pem), false).unwrap();
    let redirect = lab.rt.block_on(http.get(&url)).unwrap();
    assert_eq!(redirect.status.as_u16(), 302);
    let callback = redirect.headers["location"].to_str().unwrap().to_string();
    assert!(callback.starts_with("http://localhost:"), "{callback}");
    // A callback with a wrong state is refused, and jmp keeps waiting.
    let forged = lab
        .rt
        .block_on(http.get(&callback.replace("state=", "state=x")))
        .unwrap();
    assert_eq!(forged.status.as_u16(), 400);
    let done = lab.rt.block_on(http.get(&callback)).unwrap();
    assert_eq!(done.status.as_u16(), 200);
    let status = child.wait().unwrap();
    let rest: Vec<String> = rx.try_iter().collect();
    assert!(status.success(), "{rest:?}");
    let cfg = load(&lab.client_path("carol"));
    assert_eq!(cfg.endpoint.as_deref(), Some(lab.endpoint().as_str()));
    assert_eq!(cfg.metadata.namespace.as_deref(), Some("default"));
    assert!(!cfg.tls.insecure);
    assert!(!cfg.tls.ca.is_empty());
    assert!(cfg.refresh_token.is_some());
    assert!(
        lab.ok(&["get", "exporters", "--client", "carol", "-o", "name"])
            .contains("ex1")
    );
}

#[test]
fn device_flow_login_polls_until_approved_and_slows_down_when_told() {
    let lab = OidcLab::new(false);
    lab.add_client("carol", "fake:carol");
    // Pending, then slow_down (the next poll comes 5 s later), then approved.
    lab.issuer().set_device_script(DeviceScript {
        pending: 2,
        slow_down_at: Some(2),
        outcome: DeviceOutcome::Approve,
        interval: 1,
    });
    let out = lab.ok(&args(&lab.device_login_args("headless")));
    assert!(
        out.contains("To sign in, open the following URL in your browser:")
            && out.contains(&format!("{}/activate", lab.issuer().url))
            && out.contains("Then enter the code: USER-"),
        "{out}"
    );
    assert!(out.contains("Waiting for authentication..."), "{out}");
    assert!(out.contains("Login successful"), "{out}");
    let polls = &lab.issuer().device_polls()[0];
    assert_eq!(polls.len(), 3, "{polls:?}");
    assert!(polls[1] - polls[0] < Duration::from_secs(3), "{polls:?}");
    assert!(polls[2] - polls[1] >= Duration::from_secs(6), "{polls:?}");
    let cfg = load(&lab.client_path("headless"));
    assert_eq!(
        jumpstarter_core::oidc::token_issuer(cfg.token.as_deref().unwrap()).as_deref(),
        Some(lab.issuer().url.as_str())
    );
    let listed = lab.ok(&["get", "exporters", "--client", "headless", "-o", "name"]);
    assert!(listed.contains("ex1"), "{listed}");

    // JMP_OIDC_DEVICE_FLOW=1 chooses it without the flag.
    lab.issuer().set_device_script(DeviceScript {
        pending: 0,
        ..DeviceScript::default()
    });
    let mut a = lab.device_login_args("by-env");
    a.retain(|x| x != "--device-flow");
    let out = lab
        .cmd()
        .env("JMP_OIDC_DEVICE_FLOW", "1")
        .args(args(&a))
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("Then enter the code"), "{stdout}{stderr}");
    assert!(lab.client_path("by-env").exists());
}

#[test]
fn device_flow_denied_or_expired_is_a_clear_error_and_writes_nothing() {
    let lab = OidcLab::new(false);
    lab.add_client("carol", "fake:carol");
    for (outcome, message) in [
        (
            DeviceOutcome::Deny,
            "Authorization request was denied by the user.",
        ),
        (
            DeviceOutcome::Expire,
            "Device authorization has expired. Please try again.",
        ),
    ] {
        lab.issuer().set_device_script(DeviceScript {
            pending: 1,
            slow_down_at: None,
            outcome,
            interval: 1,
        });
        let e = lab.fails(&args(&lab.device_login_args("nope")));
        assert!(e.contains(message), "{e}");
        assert!(!lab.client_path("nope").exists());
    }
}
