//! Metrics end to end: the real `jumpstarter-controller`, a standalone `jumpstarter-router`
//! and `jmp run --metrics-listen`, scraped by a real Prometheus (Debian's `prometheus` package,
//! with exemplar storage on); one `jmp shell -- j power on`, then Prometheus' HTTP API has
//! the lease, driver call and tunnel series, and exemplars carrying the lease's id. Each
//! endpoint's page passes `promtool check metrics`.
//!
//! Without `/usr/bin/prometheus` the test says so and passes, except in CI (`CI=true`),
//! where it fails: `cargo xtask ci-prepare` installs the package.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{JMP, Running, Scratch, json_logs::Logged, text};

const PROMETHEUS: &str = "/usr/bin/prometheus";
const PROMTOOL: &str = "/usr/bin/promtool";

/// Prometheus and promtool, or `None` (outside CI) when the package is missing.
fn prometheus() -> Option<()> {
    if Path::new(PROMETHEUS).exists() && Path::new(PROMTOOL).exists() {
        return Some(());
    }
    let msg = format!(
        "metrics test: {PROMETHEUS} or {PROMTOOL} is missing; `apt-get install prometheus` \
         (cargo xtask ci-prepare does)"
    );
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{msg}");
    }
    eprintln!("{msg} (skipped outside CI)");
    None
}

/// One HTTP/1.1 GET of `path` on `addr`: the status line and the body.
fn get(addr: SocketAddr, path: &str, accept: Option<&str>) -> (String, String) {
    try_get(addr, path, accept).unwrap_or_else(|e| panic!("GET http://{addr}{path}: {e}"))
}

/// [`get`], or the error connecting.
fn try_get(
    addr: SocketAddr,
    path: &str,
    accept: Option<&str>,
) -> std::io::Result<(String, String)> {
    let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let accept = accept
        .map(|a| format!("Accept: {a}\r\n"))
        .unwrap_or_default();
    write!(
        c,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{accept}Connection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    c.read_to_end(&mut raw)?;
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        unchunk(body)
    } else {
        body.to_string()
    };
    Ok((head.lines().next().unwrap_or_default().to_string(), body))
}

fn unchunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// A free loopback port (Prometheus takes an address, not a listener).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `promtool check metrics` on the page `addr` serves in the Prometheus text format.
fn promtool_check(addr: SocketAddr, what: &str) {
    let (status, page) = get(addr, "/metrics", None);
    assert!(status.contains("200"), "{what}: {status}");
    let mut c = Command::new(PROMTOOL)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(page.as_bytes()).unwrap();
    let out = c.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics on the {what}'s page: {:?}\n{page}",
        text(&out)
    );
}

/// Asks Prometheus `query` (an instant query) until `ok` holds of its result (60 s at most).
fn wait_query(prom: SocketAddr, query: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    let path = format!("/api/v1/query?query={}", urlencode(query));
    loop {
        // Prometheus may still be starting: no answer yet is asked again.
        let body = try_get(prom, &path, None)
            .map(|(_, b)| b)
            .unwrap_or_else(|e| e.to_string());
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let result = &v["data"]["result"];
        if ok(result) {
            return result.clone();
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus: no {query} within 60 s: {body}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The first sample's value of an instant query's result.
fn value(result: &Value) -> f64 {
    result[0]["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// The exemplars Prometheus holds for `query` (all time): their label sets.
fn exemplars(prom: SocketAddr, query: &str) -> Vec<Value> {
    let path = format!(
        "/api/v1/query_exemplars?query={}&start=0&end=4102444800",
        urlencode(query)
    );
    let (_, body) = get(prom, &path, None);
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    v["data"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|series| series["exemplars"].as_array().cloned().unwrap_or_default())
        .map(|e| e["labels"].clone())
        .collect()
}

/// The address after `key=` in a line (`metrics=127.0.0.1:1234 ...`).
fn addr_after(line: &str, key: &str) -> SocketAddr {
    let at = line
        .find(key)
        .unwrap_or_else(|| panic!("no {key} in {line}"));
    let rest = &line[at + key.len()..];
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ':'))
        .unwrap_or(rest.len());
    rest[..end]
        .parse()
        .unwrap_or_else(|e| panic!("{line}: {e}"))
}

#[test]
fn prometheus_scrapes_lease_driver_call_and_tunnel_metrics_with_exemplars() {
    if prometheus().is_none() {
        return;
    }
    let s = Scratch::new();
    let bin = crate::doc_examples::controller_dir().join("jumpstarter-controller");
    let admin = s.path("admin.yaml");
    // Tunnels go through the standalone router, started once the controller has written
    // the router key and its certificate.
    let router_port = free_port();
    let routers = s.path("routers.yaml");
    std::fs::write(
        &routers,
        format!("metrics:\n  endpoint: 127.0.0.1:{router_port}\n"),
    )
    .unwrap();
    let mut ctl = Command::new(bin);
    ctl.current_dir(s.dir.path())
        .arg("--data-dir")
        .arg(s.path("data"))
        .args(["--listen", "127.0.0.1:0", "--router-listen", "127.0.0.1:0"])
        .args(["--metrics-listen", "127.0.0.1:0"])
        .args(["--metrics-exporter-labels", "kind"])
        .args(["--advertise-host", "127.0.0.1", "--routers"])
        .arg(&routers)
        .arg("--admin-config")
        .arg(&admin)
        .env_remove("JMP_LOG_FORMAT")
        .env_remove("RUST_LOG");
    let mut ctl = Logged::start(ctl);
    let ready = ctl.wait_for("saying it is ready", |l| {
        l.contains("jumpstarter-controller ready")
    });
    let ctl_metrics = addr_after(&ready, "metrics=");
    let data = s.path("data");
    let key = std::fs::read_to_string(data.join("router-key")).unwrap();
    let mut router = Command::new(crate::doc_examples::controller_dir().join("jumpstarter-router"));
    router
        .args([
            "--listen",
            &format!("127.0.0.1:{router_port}"),
            "--tls-cert",
        ])
        .arg(data.join("server").join("tls.crt"))
        .arg("--tls-key")
        .arg(data.join("server").join("tls.key"))
        .args(["--metrics-listen", "127.0.0.1:0"])
        .env("ROUTER_KEY", key.trim())
        .env_remove("JMP_LOG_FORMAT")
        .env_remove("RUST_LOG");
    let mut router = Logged::start(router);
    let router_metrics = addr_after(
        &router.wait_for("naming its metrics address", |l| {
            l.contains("Router metrics on http://")
        }),
        "http://",
    );
    router.wait_for("listening", |l| l.contains("Router listening on"));

    let jmp_admin = |args: &[&str]| {
        let out = s
            .cmd(JMP)
            .env("JMP_ADMIN_CONFIG", &admin)
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {:?}", text(&out));
    };
    let exporter = s.path("board.yaml");
    jmp_admin(&[
        "admin",
        "create",
        "exporter",
        "board",
        "-l",
        "kind=metrics",
        "--out",
        exporter.to_str().unwrap(),
    ]);
    // A mock power switch, and a mock storage mux whose medium an image is written to
    // (a resource stream: its bytes are counted).
    let medium = s.path("medium.img");
    std::fs::write(&medium, b"").unwrap();
    let image = s.path("image.bin");
    std::fs::write(&image, vec![7u8; 200 * 1024]).unwrap();
    let config = std::fs::read_to_string(&exporter).unwrap().replace(
        "\nexport:\n",
        &format!(
            "\nexport:\n  power:\n    type: jumpstarter_driver_power.driver.MockPower\n  \
             storage:\n    type: jumpstarter_driver_opendal.driver.MockStorageMux\n    \
             config:\n      file: {}\n",
            medium.display()
        ),
    );
    std::fs::write(&exporter, config).unwrap();
    jmp_admin(&["admin", "create", "client", "ci", "--save", "--unsafe"]);

    let mut run = s.cmd(JMP);
    run.args([
        "run",
        "--metrics-listen",
        "127.0.0.1:0",
        "--exporter-config",
    ])
    .arg(&exporter)
    .env_remove("JMP_LOG_FORMAT")
    .env_remove("RUST_LOG")
    .env_remove("JMP_LOG");
    let mut run = Logged::start(run);
    let serving = run.wait_for("naming its metrics address", |l| {
        l.contains("Serving metrics on http://")
    });
    let exp_metrics = addr_after(&serving, "http://");
    run.wait_for("saying it registered", |l| {
        l.contains("registered with controller")
    });

    // Prometheus, scraping both every second, its exemplar storage on.
    let prom_port = free_port();
    let prom = SocketAddr::from(([127, 0, 0, 1], prom_port));
    let config = s.path("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
             scrape_configs:\n\
             - job_name: jumpstarter-controller\n  static_configs:\n  - targets: ['{ctl_metrics}']\n\
             - job_name: jumpstarter-router\n  static_configs:\n  - targets: ['{router_metrics}']\n\
             - job_name: jumpstarter-exporter\n  static_configs:\n  - targets: ['{exp_metrics}']\n"
        ),
    )
    .unwrap();
    let mut p = Command::new(PROMETHEUS);
    p.arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", s.path("tsdb").display()))
        .arg(format!("--web.listen-address={prom}"))
        .arg("--enable-feature=exemplar-storage")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(s.path("prometheus.log")).unwrap());
    let _prometheus = Running(p.spawn().unwrap());
    // Both targets up.
    wait_query(prom, "sum(up)", |r| value(r) >= 3.0);

    let out = s
        .cmd(JMP)
        .args([
            "shell",
            "--client",
            "ci",
            "-l",
            "kind=metrics",
            "--context",
            "build_id=n42",
            "--",
            "sh",
            "-c",
            &format!(
                "j power on && j storage write-local-file {}",
                image.display()
            ),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{:?}", text(&out));
    run.wait_for("saying the lease ended", |l| l.contains("ended"));

    // The lease's id, from the exporter's page (its exemplar).
    let (_, page) = get(
        exp_metrics,
        "/metrics",
        Some("application/openmetrics-text;version=1.0.0"),
    );
    let line = page
        .lines()
        .find(|l| l.starts_with("jumpstarter_operations_total{") && l.contains("operation=\"on\""))
        .unwrap_or_else(|| panic!("no operation on: {page}"));
    assert!(line.contains("result=\"success\""), "{line}");
    assert!(line.contains("driver_type=\"MockPower\""), "{line}");
    assert!(line.contains("exporter=\"board\""), "{line}");
    let lease = line
        .split("lease_id=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap_or_else(|| panic!("no lease_id exemplar: {line}"))
        .to_string();
    assert!(line.contains("client=\"ci\""), "{line}");
    assert!(line.contains("build_id=\"n42\""), "{line}");

    let ops = wait_query(
        prom,
        "jumpstarter_operations_total{operation=\"on\",result=\"success\"}",
        |r| value(r) >= 1.0,
    );
    assert_eq!(ops[0]["metric"]["driver_type"], "MockPower", "{ops}");
    wait_query(
        prom,
        "jumpstarter_operation_duration_seconds_count{operation=\"on\"}",
        |r| value(r) >= 1.0,
    );
    wait_query(
        prom,
        "jumpstarter_lease_acquisitions_total{result=\"granted\"}",
        |r| value(r) >= 1.0,
    );
    wait_query(prom, "jumpstarter_lease_wait_duration_seconds_count", |r| {
        value(r) >= 1.0
    });
    // The standalone router's tunnel and byte counters (the controller's in-process router
    // serves the same names, unused here).
    wait_query(
        prom,
        "jumpstarter_router_tunnels_total{job=\"jumpstarter-router\"}",
        |r| value(r) >= 1.0,
    );
    wait_query(
        prom,
        "jumpstarter_router_bytes_forwarded_total{job=\"jumpstarter-router\"}",
        |r| value(r) > 0.0,
    );
    wait_query(
        prom,
        "jumpstarter_exporters_online{kind=\"metrics\"}",
        |r| value(r) >= 1.0,
    );
    wait_query(
        prom,
        "jumpstarter_active_sessions{exporter=\"board\"}",
        |r| !r.as_array().is_none_or(|a| a.is_empty()),
    );

    // Exemplars with the lease's id, on the exporter's and on the controller's counters.
    for query in [
        "jumpstarter_operations_total",
        "jumpstarter_lease_acquisitions_total",
    ] {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let found = exemplars(prom, query);
            if found.iter().any(|l| l["lease_id"] == lease.as_str()) {
                assert!(found.iter().any(|l| l["client"] == "ci"), "{found:?}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no exemplar of {query} with lease_id {lease} within 60 s: {found:?}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    // The image's bytes, into the exporter.
    let bytes = wait_query(
        prom,
        "sum(jumpstarter_stream_bytes_total{direction=\"rx\"})",
        |r| value(r) >= (200 * 1024) as f64,
    );
    assert!(value(&bytes) >= (200 * 1024) as f64, "{bytes}");
    assert_eq!(std::fs::metadata(&medium).unwrap().len(), 200 * 1024);

    promtool_check(ctl_metrics, "controller");
    promtool_check(exp_metrics, "exporter");
    promtool_check(router_metrics, "router");
}

/// `jmp run --tls-grpc-listener --metrics-listen`: the one session's calls are counted
/// (no lease: no exemplar) and it is the one active session.
#[test]
fn a_standalone_exporter_counts_its_calls() {
    let s = Scratch::new();
    s.write(
        "exporter.yaml",
        "apiVersion: jumpstarter.dev/v1alpha1\nkind: ExporterConfig\nmetadata:\n  \
         namespace: default\n  name: bench\nendpoint: \"\"\ntoken: \"\"\nexport:\n  \
         power:\n    type: jumpstarter_driver_power.driver.MockPower\n",
    );
    // The helper reads the exporter's stderr up to its address: the metrics port is chosen
    // here.
    let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let (_exporter, port) = crate::start_exporter(
        &s,
        &[
            "--tls-grpc-insecure",
            "--metrics-listen",
            &metrics.to_string(),
        ],
    );
    let out = s
        .cmd(crate::J)
        .env("JUMPSTARTER_HOST", format!("127.0.0.1:{port}"))
        .env("JMP_GRPC_INSECURE", "1")
        .args(["power", "on"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{:?}", text(&out));
    let (_, page) = get(
        metrics,
        "/metrics",
        Some("application/openmetrics-text;version=1.0.0"),
    );
    assert!(
        page.contains(
            "jumpstarter_operations_total{exporter=\"bench\",operation=\"on\",result=\"success\",driver_type=\"MockPower\"} 1\n"
        ),
        "{page}"
    );
    assert!(
        page.contains("jumpstarter_active_sessions{exporter=\"bench\"} 1\n"),
        "{page}"
    );
}
