//! PDU power drivers against real agents: `SNMPServer` against Debian's `snmpd` (configured
//! here, in a temp dir, to simulate outlets with a `pass` script) and `HttpPower` against a
//! local HTTP server.
//!
//! The SNMP tests need `snmpd` (Debian package `snmpd`, installed by `cargo xtask ci`);
//! without it they say so and pass, except in CI (`CI=true`), where they fail naming it.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::StreamExt;
use jumpstarter_core::{Driver, driver::DriverArgs};
use jumpstarter_drivers::{HttpPower, MockPower, PowerClient, SnmpServer};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::Served;

const BASE_OID: &str = "1.3.6.1.4.1.13742.6.4.1.2.1.2.1";

/// The net-snmp `pass` script: one INTEGER per plug under the base OID, kept in files.
const OUTLET_SCRIPT: &str = r#"#!/bin/sh
dir=$(dirname "$0")/state
base=.1.3.6.1.4.1.13742.6.4.1.2.1.2.1
mkdir -p "$dir"
case "$1" in
  -g) plug=${2#$base.}
      [ "$plug" = "$2" ] && exit 0
      echo "$2"; echo integer; cat "$dir/$plug" 2>/dev/null || echo 0 ;;
  -s) plug=${2#$base.}
      [ "$3" = integer ] || { echo wrong-type; exit 0; }
      case "$4" in 0|1) echo "$4" > "$dir/$plug" ;; *) echo wrong-value ;; esac ;;
  *) exit 0 ;;
esac
"#;

fn find_snmpd() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join("snmpd"))
        .find(|p| p.is_file())
}

/// A real `snmpd` on a loopback port, killed when dropped.
struct Snmpd {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Drop for Snmpd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Snmpd {
    /// Starts snmpd, or says why it cannot (failing in CI).
    fn start() -> Option<Snmpd> {
        let Some(snmpd) = find_snmpd() else {
            let msg = "SNMP power test: snmpd is missing (Debian package snmpd; \
                       `cargo xtask ci` installs it)";
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{msg}");
            }
            eprintln!("{msg} (skipped outside CI)");
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("outlet.sh");
        std::fs::write(&script, OUTLET_SCRIPT).unwrap();
        let port = std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let conf = dir.path().join("snmpd.conf");
        std::fs::write(
            &conf,
            format!(
                "agentaddress udp:127.0.0.1:{port}
createUser noauth
createUser md5user MD5 \"authpass1\"
createUser shauser SHA \"authpass1\"
createUser shaaes SHA \"authpass1\" AES \"privpass1\"
createUser md5des MD5 \"authpass1\" DES \"privpass1\"
createUser readonly SHA \"authpass1\"
rwuser noauth noauth
rwuser md5user auth
rwuser shauser auth
rwuser shaaes priv
rwuser md5des priv
rouser readonly auth
pass .{BASE_OID} /bin/sh {}
",
                script.display()
            ),
        )
        .unwrap();
        std::fs::create_dir(dir.path().join("persist")).unwrap();
        std::fs::create_dir(dir.path().join("mibs")).unwrap();
        let log = dir.path().join("snmpd.log");
        let child = Command::new(snmpd)
            .args(["-f", "-C", "-c"])
            .arg(&conf)
            .arg("-Lf")
            .arg(&log)
            .args(["-M"])
            .arg(dir.path().join("mibs"))
            .args(["-m", ""])
            // No SMUX listener on port 199: tests run agents side by side.
            .args(["-I", "-smux"])
            .env("SNMP_PERSISTENT_DIR", dir.path().join("persist"))
            .env("SNMPCONFPATH", dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut agent = Snmpd { child, port, dir };
        // snmpd logs its version once it listens.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("NET-SNMP version") {
                break;
            }
            if let Some(status) = agent.child.try_wait().unwrap() {
                panic!("snmpd exited ({status}): {text}");
            }
            assert!(Instant::now() < deadline, "snmpd did not start: {text}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(agent)
    }

    /// The outlet state the agent stored for `plug` (`None`: never set).
    fn outlet(&self, plug: u32) -> Option<String> {
        std::fs::read_to_string(self.dir.path().join("state").join(plug.to_string()))
            .ok()
            .map(|s| s.trim().to_string())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("snmpd.log")).unwrap_or_default()
    }
}

fn snmp(config: serde_json::Value) -> Arc<dyn Driver> {
    SnmpServer::from_args(&DriverArgs { config }).unwrap()
}

async fn power(served: &Served, name: &str) -> PowerClient {
    PowerClient(served.client().await.driver(name).unwrap())
}

#[tokio::test]
async fn snmp_power_switches_a_real_snmpd_outlet_at_every_security_level() {
    let Some(agent) = Snmpd::start() else { return };
    let users = [
        (json!({"user": "noauth"}), 1),
        (
            json!({"user": "md5user", "auth_protocol": "MD5", "auth_key": "authpass1"}),
            2,
        ),
        (
            json!({"user": "shauser", "auth_protocol": "SHA", "auth_key": "authpass1"}),
            3,
        ),
        (
            json!({"user": "shaaes", "auth_protocol": "SHA", "auth_key": "authpass1",
                   "priv_protocol": "AES", "priv_key": "privpass1"}),
            4,
        ),
        (
            json!({"user": "md5des", "auth_protocol": "MD5", "auth_key": "authpass1",
                   "priv_protocol": "DES", "priv_key": "privpass1"}),
            5,
        ),
    ];
    let mut children = Vec::new();
    let names: Vec<String> = (1..=users.len()).map(|i| format!("pdu{i}")).collect();
    for ((cfg, plug), name) in users.iter().zip(&names) {
        let mut cfg = cfg.clone();
        cfg["host"] = json!("127.0.0.1");
        cfg["port"] = json!(agent.port);
        cfg["plug"] = json!(plug);
        children.push((name.as_str(), snmp(cfg)));
    }
    let served = Served::start(children);
    let session = served.client().await;
    for ((cfg, plug), name) in users.iter().zip(&names) {
        let node = session.driver(name).unwrap();
        assert_eq!(
            node.node().client_class(),
            "jumpstarter_driver_snmp.client.SNMPServerClient"
        );
        let p = PowerClient(node);
        assert_eq!(agent.outlet(*plug), None);
        p.on()
            .await
            .unwrap_or_else(|e| panic!("{cfg}: {e}\n{}", agent.log()));
        assert_eq!(agent.outlet(*plug).as_deref(), Some("1"), "{cfg}");
        p.off().await.unwrap();
        assert_eq!(agent.outlet(*plug).as_deref(), Some("0"), "{cfg}");
        p.cycle(Duration::from_millis(10)).await.unwrap();
        assert_eq!(agent.outlet(*plug).as_deref(), Some("1"), "{cfg}");
    }
    // Upstream's driver answers `on` with a message; the client ignores it.
    let msg: String = session
        .driver("pdu1")
        .unwrap()
        .call("on", ())
        .await
        .unwrap();
    assert_eq!(msg, "Power ON command sent successfully");
}

#[tokio::test]
async fn snmp_errors_name_the_config_field_at_fault() {
    let Some(agent) = Snmpd::start() else { return };
    let base = json!({"host": "127.0.0.1", "port": agent.port, "plug": 9, "timeout": 3.0});
    let with = |extra: serde_json::Value| {
        let mut cfg = base.clone();
        for (k, v) in extra.as_object().unwrap() {
            cfg[k] = v.clone();
        }
        snmp(cfg)
    };
    let served = Served::start(vec![
        ("unknown_user", with(json!({"user": "nobody"}))),
        (
            "wrong_auth",
            with(json!({"user": "md5user", "auth_protocol": "MD5", "auth_key": "wrongpass"})),
        ),
        (
            "wrong_priv",
            with(
                json!({"user": "shaaes", "auth_protocol": "SHA", "auth_key": "authpass1",
                        "priv_protocol": "AES", "priv_key": "wrongpass"}),
            ),
        ),
        (
            "read_only",
            with(json!({"user": "readonly", "auth_protocol": "SHA", "auth_key": "authpass1"})),
        ),
        (
            "other_oid",
            with(json!({"user": "noauth", "oid": "1.3.6.1.4.1.99999.1"})),
        ),
    ]);
    for (name, wanted) in [
        ("unknown_user", "config field `user`"),
        ("wrong_auth", "config field `auth_key`"),
        ("wrong_priv", "config fields `priv_protocol` and `priv_key`"),
        ("read_only", "SNMP error"),
        ("other_oid", "SNMP error"),
    ] {
        let err = power(&served, name)
            .await
            .on()
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(wanted), "{name}: {err}");
        assert!(err.contains("SNMP set failed"), "{name}: {err}");
    }
    assert_eq!(
        agent.outlet(9),
        None,
        "a refused request changed the outlet"
    );
}

#[tokio::test]
async fn snmp_agent_that_does_not_answer_fails_naming_host_and_other_drivers_keep_working() {
    // A bound socket that never answers (no ICMP "port unreachable" either).
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let served = Served::start(vec![
        (
            "pdu",
            snmp(
                json!({"host": "127.0.0.1", "port": port, "user": "u", "plug": 1, "timeout": 1.5}),
            ),
        ),
        (
            "nowhere",
            snmp(json!({"host": "no-such-host.invalid", "user": "u", "plug": 1, "timeout": 1.0})),
        ),
        ("mock", Arc::new(MockPower::default()) as Arc<dyn Driver>),
    ]);
    let started = Instant::now();
    let err = power(&served, "pdu")
        .await
        .on()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("did not answer") && err.contains("config field `host`"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    let err = power(&served, "nowhere")
        .await
        .off()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no-such-host.invalid (config field `host`)"),
        "{err}"
    );
    // The session still serves, and the other driver works.
    power(&served, "mock").await.on().await.unwrap();
    drop(silent);
}

/// One request the test HTTP server saw.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    method: String,
    path: String,
    body: String,
    authorization: Option<String>,
}

/// A local HTTP/1.1 server: answers each request with `(status, body)` chosen by path and
/// records what it saw.
struct HttpServer {
    port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn http_server(answer: fn(&str) -> (u16, &'static str)) -> HttpServer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            let head_end = loop {
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break i + 4;
                }
                let n = conn.read(&mut chunk).await.unwrap();
                assert!(n > 0 && buf.len() < 65536, "bad request");
                buf.extend_from_slice(&chunk[..n]);
            };
            let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
            let header = |name: &str| {
                head.lines().find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
                })
            };
            let len: usize = header("content-length").map_or(0, |l| l.parse().unwrap());
            while buf.len() < head_end + len {
                let n = conn.read(&mut chunk).await.unwrap();
                assert!(n > 0);
                buf.extend_from_slice(&chunk[..n]);
            }
            let mut first = head.lines().next().unwrap().split(' ');
            let method = first.next().unwrap().to_string();
            let path = first.next().unwrap().to_string();
            let (status, body) = answer(&path);
            log.lock().unwrap().push(Seen {
                method,
                path,
                body: String::from_utf8_lossy(&buf[head_end..head_end + len]).into_owned(),
                authorization: header("authorization"),
            });
            let resp = format!(
                "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = conn.write_all(resp.as_bytes()).await;
            let _ = conn.shutdown().await;
        }
    });
    HttpServer { port, seen, task }
}

fn http_power(config: serde_json::Value) -> Arc<dyn Driver> {
    HttpPower::from_args(&DriverArgs { config }).unwrap()
}

#[tokio::test]
async fn http_power_sends_the_configured_requests_and_reads_json() {
    let server = http_server(|path| match path {
        "/read" => (200, r#"{"emeter": {"voltage": 231.5, "current": 0.25}}"#),
        "/broken" => (500, "boom"),
        _ => (200, "OK"),
    })
    .await;
    let base = format!("http://127.0.0.1:{}", server.port);
    let served = Served::start(vec![
        (
            "plug",
            http_power(json!({
                "name": "splug",
                "power_on": {"url": format!("{base}/on"), "method": "POST", "data": "power=on"},
                "power_off": {"url": format!("{base}/relay/0?turn=off")},
                "power_read": {"url": format!("{base}/read"), "voltage_path": "emeter.voltage",
                               "current_path": "emeter.current"},
                "auth": {"basic": {"user": "admin", "password": "secret"}}
            })),
        ),
        (
            "broken",
            http_power(json!({
                "power_on": {"url": format!("{base}/broken")},
                "power_off": {"url": "http://127.0.0.1:9/off"}
            })),
        ),
    ]);
    let session = served.client().await;
    let plug = PowerClient(session.driver("plug").unwrap());
    assert_eq!(
        plug.0.node().client_class(),
        "jumpstarter_driver_power.client.PowerClient"
    );
    plug.on().await.unwrap();
    plug.off().await.unwrap();
    let readings: Vec<_> = plug.read().await.unwrap().collect().await;
    assert_eq!(readings.len(), 1);
    let r = readings[0].as_ref().unwrap();
    assert_eq!((r.voltage, r.current), (231.5, 0.25));
    let auth = Some("Basic YWRtaW46c2VjcmV0".to_string());
    assert_eq!(
        *server.seen.lock().unwrap(),
        vec![
            Seen {
                method: "POST".into(),
                path: "/on".into(),
                body: "power=on".into(),
                authorization: auth.clone()
            },
            Seen {
                method: "GET".into(),
                path: "/relay/0?turn=off".into(),
                body: String::new(),
                authorization: auth.clone()
            },
            Seen {
                method: "GET".into(),
                path: "/read".into(),
                body: String::new(),
                authorization: auth
            },
        ]
    );

    // An error status, a refused connection, a missing read endpoint: clear errors.
    let broken = PowerClient(session.driver("broken").unwrap());
    let err = broken.on().await.unwrap_err().to_string();
    assert!(err.contains("power_on") && err.contains("500"), "{err}");
    let err = broken.off().await.unwrap_err().to_string();
    assert!(
        err.contains("power_off") && err.contains("cannot connect"),
        "{err}"
    );
    let err = match broken.read().await {
        Ok(mut s) => s.next().await.unwrap().unwrap_err().to_string(),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("power_read endpoint is not configured"),
        "{err}"
    );
    // The good driver still works after the failures.
    plug.on().await.unwrap();
}
