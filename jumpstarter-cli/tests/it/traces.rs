//! Traces over OTLP: the real `jumpstarter-controller` and `jmp run` send their spans of a
//! lease to an OTLP receiver of the test (the collector's `TraceService` on loopback); one
//! `jmp shell -- j power on` is one trace across both. Traces off, or a collector that is
//! down, change nothing for the lease.

use std::{
    collections::HashMap,
    process::Command,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use opentelemetry_proto::tonic::{
    collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
        trace_service_server::{TraceService, TraceServiceServer},
    },
    common::v1::any_value,
};

use crate::{JMP, Scratch, json_logs::Logged, text};

/// One span as the receiver got it.
#[derive(Debug, Clone)]
struct Got {
    service: String,
    name: String,
    trace_id: Vec<u8>,
    span_id: Vec<u8>,
    parent_span_id: Vec<u8>,
    attributes: HashMap<String, String>,
}

#[derive(Clone, Default)]
struct Receiver(Arc<Mutex<Vec<Got>>>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut got = self.0.lock().unwrap();
        for rs in request.into_inner().resource_spans {
            let attrs = |kvs: &[opentelemetry_proto::tonic::common::v1::KeyValue]| {
                kvs.iter()
                    .filter_map(|kv| {
                        let v = match kv.value.as_ref()?.value.as_ref()? {
                            any_value::Value::StringValue(s) => s.clone(),
                            any_value::Value::IntValue(i) => i.to_string(),
                            any_value::Value::BoolValue(b) => b.to_string(),
                            any_value::Value::DoubleValue(d) => d.to_string(),
                            _ => return None,
                        };
                        Some((kv.key.clone(), v))
                    })
                    .collect::<HashMap<_, _>>()
            };
            let service = rs
                .resource
                .as_ref()
                .and_then(|r| attrs(&r.attributes).remove("service.name"))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    got.push(Got {
                        service: service.clone(),
                        name: s.name.clone(),
                        trace_id: s.trace_id.clone(),
                        span_id: s.span_id.clone(),
                        parent_span_id: s.parent_span_id.clone(),
                        attributes: attrs(&s.attributes),
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// An OTLP/gRPC receiver on 127.0.0.1:0, for as long as it lives.
struct Collector {
    _rt: tokio::runtime::Runtime,
    url: String,
    spans: Receiver,
}

impl Collector {
    fn start() -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let spans = Receiver::default();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let service = TraceServiceServer::new(spans.clone());
        rt.spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        Self {
            _rt: rt,
            url,
            spans,
        }
    }

    fn spans(&self) -> Vec<Got> {
        self.spans.0.lock().unwrap().clone()
    }

    /// Waits (up to 60 s) until the spans got so far satisfy `f`.
    fn wait_for(&self, what: &str, f: impl Fn(&[Got]) -> bool) -> Vec<Got> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let spans = self.spans();
            if f(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "no {what} within 60 s; got: {spans:#?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The OTEL settings of the test's own environment must not leak into the binaries.
fn without_otel_env(c: &mut Command) -> &mut Command {
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("OTEL_") {
            c.env_remove(k);
        }
    }
    // Batches go out at once: the test waits for them, not for the default 5 s.
    c.env("OTEL_BSP_SCHEDULE_DELAY", "100")
}

/// How a process is told about traces: its arguments and environment.
#[derive(Default)]
struct Otel<'a> {
    args: &'a [&'a str],
    env: &'a [(&'a str, &'a str)],
}

/// A controller (with `ctl_otel`) and `jmp run` (with `run_otel`) of one exporter `board`
/// with a MockPower, and a client `ci`; runs `jmp shell -- j power on` (which must succeed)
/// and returns once both the controller and the exporter said the lease ended.
fn one_lease(s: &Scratch, ctl_otel: Otel<'_>, run_otel: Otel<'_>) -> (Logged, Logged) {
    let bin = crate::doc_examples::controller_dir().join("jumpstarter-controller");
    let admin = s.path("admin.yaml");
    let mut ctl = Command::new(bin);
    ctl.current_dir(s.dir.path())
        .arg("--data-dir")
        .arg(s.path("data"))
        .args(["--listen", "127.0.0.1:0", "--router-listen", "127.0.0.1:0"])
        .args(["--metrics-listen", "off", "--admin-config"])
        .arg(&admin)
        .args(ctl_otel.args)
        .env_remove("RUST_LOG")
        .env_remove("JMP_LOG_FORMAT");
    without_otel_env(&mut ctl).envs(ctl_otel.env.iter().copied());
    let mut ctl = Logged::start(ctl);
    ctl.wait_for("jumpstarter-controller ready", |l| {
        l.contains("jumpstarter-controller ready")
    });

    let exporter = s.mock_board_and_client(&admin, "kind=traces");

    let mut run = s.cmd(JMP);
    run.args(["run", "--exporter-config"])
        .arg(&exporter)
        .args(run_otel.args)
        .env_remove("RUST_LOG")
        .env_remove("JMP_LOG")
        .env_remove("JMP_LOG_FORMAT");
    without_otel_env(&mut run).envs(run_otel.env.iter().copied());
    let mut run = Logged::start(run);
    run.wait_for("registered with controller", |l| {
        l.contains("registered with controller")
    });

    let mut shell = s.cmd(JMP);
    shell.args([
        "shell",
        "--client",
        "ci",
        "-l",
        "kind=traces",
        "--",
        "j",
        "power",
        "on",
    ]);
    without_otel_env(&mut shell);
    let out = shell.output().unwrap();
    assert!(out.status.success(), "{:?}", text(&out));
    run.wait_for("ended", |l| l.contains("ended"));
    ctl.wait_for("lease ended", |l| l.contains("lease ended"));
    (ctl, run)
}

fn named<'a>(spans: &'a [Got], name: &str) -> Vec<&'a Got> {
    spans.iter().filter(|g| g.name == name).collect()
}

#[test]
fn a_lease_is_one_trace_from_the_controller_to_the_driver_call() {
    let s = Scratch::new();
    let collector = Collector::start();
    // The controller by flag (with text logs), the exporter by the standard variable (with
    // JSON logs).
    let (_ctl, mut run) = one_lease(
        &s,
        Otel {
            args: &["--otlp-endpoint", &collector.url],
            env: &[],
        },
        Otel {
            args: &["--log-format", "json"],
            env: &[("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.url)],
        },
    );
    let all = [
        "lease",
        "lease.create",
        "lease.grant",
        "lease.dial",
        "lease.end",
        "router.tunnel",
        "lease.serve",
        "driver.call",
    ];
    let spans = collector.wait_for("span of each step", |got| {
        all.iter().all(|n| got.iter().any(|g| g.name == *n))
    });
    let create = named(&spans, "lease.create")[0];
    let lease = create.attributes["lease_id"].clone();
    assert_eq!(create.attributes["client"], "ci");
    assert_eq!(create.attributes["namespace"], "default");
    assert_eq!(create.attributes["result"], "ok");
    assert_eq!(create.service, "jumpstarter-controller");

    // One trace, whose id anyone knowing the lease derives.
    let ids = jumpstarter_core::telemetry::lease_trace_ids("default", &lease);
    let ours: Vec<&Got> = spans
        .iter()
        .filter(|g| g.attributes.get("lease_id") == Some(&lease) || g.name == "driver.call")
        .collect();
    for g in &ours {
        assert_eq!(g.trace_id, ids.trace_id, "{g:#?}");
    }
    let root = named(&spans, "lease")[0];
    assert_eq!(root.span_id, ids.root_span_id);
    assert!(root.parent_span_id.is_empty(), "{root:#?}");
    assert_eq!(root.service, "jumpstarter-controller");
    assert_eq!(root.attributes["exporter"], "board");
    for step in ["lease.create", "lease.grant", "lease.dial", "lease.end"] {
        let g = named(&spans, step)[0];
        assert_eq!(g.service, "jumpstarter-controller", "{g:#?}");
        assert_eq!(g.attributes["lease_id"], lease, "{g:#?}");
        assert_eq!(g.parent_span_id, ids.root_span_id, "{g:#?}");
    }
    for step in ["lease.grant", "lease.dial", "lease.end"] {
        assert_eq!(named(&spans, step)[0].attributes["exporter"], "board");
    }
    // The controller's in-process router: each tunnel of the lease.
    let tunnel = named(&spans, "router.tunnel")[0];
    assert_eq!(tunnel.attributes["lease_id"], lease);
    assert_eq!(tunnel.parent_span_id, ids.root_span_id);

    // The exporter's side: the lease it served, and the call in it.
    let serve = named(&spans, "lease.serve")[0];
    assert_eq!(serve.service, "jumpstarter-exporter");
    assert_eq!(serve.attributes["lease_id"], lease);
    assert_eq!(serve.attributes["client"], "ci");
    assert_eq!(serve.attributes["exporter"], "board");
    assert_eq!(serve.parent_span_id, ids.root_span_id);
    let call = spans
        .iter()
        .find(|g| {
            g.name == "driver.call"
                && g.attributes.get("operation").map(String::as_str) == Some("on")
        })
        .unwrap_or_else(|| panic!("no driver.call of on: {spans:#?}"));
    assert_eq!(call.service, "jumpstarter-exporter");
    assert_eq!(call.trace_id, ids.trace_id);
    assert_eq!(call.parent_span_id, serve.span_id);
    assert_eq!(call.attributes["driver_type"], "MockPower");
    assert_eq!(call.attributes["result"], "ok");

    // The JSON log lines are as without traces: the driver call's line has the lease's
    // fields.
    let seen = run.lines_seen().to_vec();
    let line = seen
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|o| o["message"] == "driver call" && o["operation"] == "on")
        .unwrap_or_else(|| panic!("no driver call line: {seen:#?}"));
    assert_eq!(line["lease_id"], lease.as_str(), "{line}");
    assert_eq!(line["client"], "ci", "{line}");
    assert_eq!(line["result"], "ok", "{line}");
}

#[test]
fn traces_off_or_a_collector_that_is_down_change_nothing_for_the_lease() {
    let s = Scratch::new();
    let collector = Collector::start();
    // A port nothing listens on.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    // The controller: an endpoint, but OTEL_SDK_DISABLED turns traces off. The exporter:
    // a collector that is down. The lease and its call succeed (checked in `one_lease`).
    let (_ctl, mut run) = one_lease(
        &s,
        Otel {
            args: &[],
            env: &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.url),
                ("OTEL_SDK_DISABLED", "true"),
            ],
        },
        Otel {
            args: &["--otlp-endpoint", &dead],
            env: &[],
        },
    );
    // A second call in another lease works as well.
    let mut shell = s.cmd(JMP);
    shell.args([
        "shell",
        "--client",
        "ci",
        "-l",
        "kind=traces",
        "--",
        "j",
        "power",
        "off",
    ]);
    let out = without_otel_env(&mut shell).output().unwrap();
    assert!(out.status.success(), "{:?}", text(&out));
    run.wait_for("ended", |l| l.contains("ended"));
    // The controller sent nothing (batches go every 100 ms; give it a few).
    std::thread::sleep(Duration::from_millis(1000));
    assert!(collector.spans().is_empty(), "{:#?}", collector.spans());

    // A bad endpoint is refused, naming it.
    let out = s
        .cmd(JMP)
        .args([
            "run",
            "--otlp-endpoint",
            "localhost:4317",
            "--exporter-config",
        ])
        .arg(s.path("board.yaml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = text(&out).1;
    assert!(
        err.contains("--otlp-endpoint") && err.contains("localhost:4317"),
        "{err}"
    );
}
