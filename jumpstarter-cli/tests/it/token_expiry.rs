//! Client token expiry (upstream main): the Client's status records when its token expires
//! with a `TokenExpiring` condition, `jmp admin get clients` shows it and the controller's
//! metrics expose it.

use std::{
    io::{Read, Write},
    process::{Command, Stdio},
    time::Duration,
};

use jumpstarter_controller::{
    ControllerConfig,
    objects::{Client, TOKEN_EXPIRING, find_condition},
    start,
    store::Store,
};

use crate::{JMP, text};

/// `GET /metrics` of the controller at `addr`.
fn metrics(addr: std::net::SocketAddr) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body
}

#[test]
fn a_client_token_that_expires_within_7_days_is_flagged_in_status_admin_get_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut cfg = ControllerConfig::loopback(dir.path().join("data"));
    cfg.admin_config = Some(dir.path().join("admin.yaml"));
    cfg.metrics_listen = Some("127.0.0.1:0".into());
    // Tokens valid for 3 days: TokenExpiring, ExpiresWithin7Days.
    cfg.token_lifetime = Some(Duration::from_secs(3 * 86_400));
    let ctl = rt.block_on(start(cfg)).unwrap();
    let jmp = |args: &[&str]| {
        let out = Command::new(JMP)
            .current_dir(dir.path())
            .env("JMP_CLIENT_CONFIG_HOME", dir.path().join("config"))
            .env("JMP_ADMIN_CONFIG", dir.path().join("admin.yaml"))
            .env("TZ", "UTC")
            .stdin(Stdio::null())
            .args(args)
            .output()
            .unwrap();
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "jmp {args:?}: {stdout}{stderr}");
        stdout
    };
    jmp(&["admin", "create", "client", "short", "--nointeractive"]);

    let c: Client = rt
        .block_on(ctl.state.store.get("default", "short"))
        .unwrap()
        .unwrap();
    let status = c.status.unwrap();
    let expires = status.token_expires_at.clone().unwrap().0;
    let left = expires.as_second() - jiff::Timestamp::now().as_second();
    assert!((3 * 86_400 - 120..=3 * 86_400).contains(&left), "{left}");
    let cond = find_condition(&status.conditions, TOKEN_EXPIRING).unwrap();
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_str()),
        ("True", "ExpiresWithin7Days")
    );
    assert!(
        cond.message.contains("(2 days remaining)"),
        "{}",
        cond.message
    );

    let date = expires.strftime("%Y-%m-%d").to_string();
    let table = jmp(&["admin", "get", "clients"]);
    assert!(
        table.starts_with("NAMESPACE  NAME   LABELS  TOKEN EXPIRES"),
        "{table}"
    );
    // 2 days and 23 hours or so: "in 3d" or "in 2d" as the age columns round.
    assert!(
        table.contains(&format!("{date} (in 3d)")) || table.contains(&format!("{date} (in 2d)")),
        "{table}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&jmp(&["admin", "get", "client", "short", "-o", "json"])).unwrap();
    assert_eq!(
        json["token_expiring"]["reason"], "ExpiresWithin7Days",
        "{json}"
    );

    let text = metrics(ctl.metrics_addr.unwrap());
    assert!(
        text.contains(&format!(
            "jumpstarter_controller_client_token_expiry_timestamp_seconds{{namespace=\"default\",name=\"short\"}} {}",
            expires.as_second()
        )),
        "{text}"
    );
    assert!(
        text.contains(
            "jumpstarter_controller_clients_token_expiring{reason=\"ExpiresWithin7Days\"} 1"
        ),
        "{text}"
    );
    rt.block_on(ctl.shutdown());
}
